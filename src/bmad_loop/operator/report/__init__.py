"""A run's reports: the run report (its data from the rows, the journal and the logs; its
geometry; its drawing as SVG and HTML; its plain text) and the CI summaries (JSON and JUnit).
"""
