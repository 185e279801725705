"""BMAD as a project keeps it: the sprint board, its statuses and layouts, story files and their
metadata, v4 projects, footprints and the plan's selection. Pure reading and editing of
BMAD's files; git only to read the committed target tree.
"""
