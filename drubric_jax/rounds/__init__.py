"""The co-evolution rounds (Algorithm 1): model roles (`roles`), one step of each phase
(`phases`: the rollouts and the update) with what it shares (`context`), its verifier calls
(`judging`), its multi-process bookkeeping (`process_items`) and its metrics
(`step_metrics`), the held-out evaluation (`heldout`), the round loop (`loop`), checkpoints
(`checkpoint`), run outputs (`run_logging`), the compilation cache (`compilation`) and
host-memory hygiene (`hostmem`).
"""
