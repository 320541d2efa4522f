"""drubric_jax: evaluator-policy co-evolution (DynamicRubric) in JAX."""

__version__ = "0.1.0"
