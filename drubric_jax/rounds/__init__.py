"""The co-evolution rounds (Algorithm 1): model roles (`roles`), one step of each phase
(`phases`), the round loop (`loop`), checkpoints (`checkpoint`), run outputs
(`run_logging`), the compilation cache (`compilation`) and host-memory hygiene (`hostmem`).
"""
