"""The memory planner (`experiments.plan`): what one device holds in each step of a round
(`terms`), the compiled memory of the real programs (`compiled`), and the plan
(`planner`).
"""
