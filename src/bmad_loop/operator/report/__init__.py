"""The run report: its data (rows, journal, logs), its geometry, its drawing (SVG, HTML) and
the files written.
"""
