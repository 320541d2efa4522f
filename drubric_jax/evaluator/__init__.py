"""The evaluator: the rubric generator G_phi (`rubric_generator`) and the frozen verifier
(`verifier`), a composition of its prompts (`verifier_prompts`), its pass sizes and memory
budgets (`budgets`), its pass schedule (`schedule`), where a pass's rows live
(`placement`), its jitted passes (`passes`), contextual calibration (`calibration`),
process shares of rows every process holds (`shares`) and its `stats=` counters
(`counters`); verdicts from its answer logits (`verdicts`; METHOD 11, 12).
"""
