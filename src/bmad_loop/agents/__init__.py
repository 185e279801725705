"""The agents: one supervised process per session, the command-adapter contract, the shipped
profiles, what a CLI's output says, the faults it reports, stall watch and process trees.

Below the engine: nothing here reads rows or knows a run.
"""
