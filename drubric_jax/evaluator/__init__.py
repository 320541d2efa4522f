"""The evaluator: the rubric generator G_phi (`rubric_generator`) and the frozen verifier
(`verifier`), with the verifier's prompts (`verifier_prompts`), its jitted passes
(`passes`), its pass schedule (`schedule`) and verdicts from its answer logits
(`verdicts`; METHOD 11, 12).
"""
