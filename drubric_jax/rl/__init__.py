"""Reinforcement learning: the GRPO loss (`grpo`, Eq. 23), group advantages (`advantages`,
Eq. 21, 24-25), rubric rewards (`rewards`, Eq. 12, 13, 15), the generator rewards' registry
(`generator_rewards`) and rule rewards (`rule_rewards`), log-probs (`logprobs`), the
trainee's config and optimizer (`train_config`) and the jitted train step (`train_step`).
"""
