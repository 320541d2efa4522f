"""Host-side text of the method: prompts, the rubric-list format and input budgets.

Pure Python (numpy for padded arrays); no module here touches a model. What is where:

- `text.prompts`: system texts and chat-message builders of the rubric generator (dynamic
  and static), the verifier (shared prefix + per-item suffix) and the direct / pairwise
  judge baselines (METHOD 1, 6, 8).
- `text.rubric_format`: the JSON schema of a rubric list, the parser of generator output
  (`parse_rubric_output`, `ParsedRubric`, `COUNTER_KEYS`), padding to M items
  (`pad_rubrics`) and the weight range `MIN_WEIGHT`..`MAX_WEIGHT` (METHOD 2, 8, 11).
- `text.json_scan`: finding the rubric JSON value inside free text (`find_rubric_value`),
  used by the parser.
- `text.budget`: cutting prompt texts to a token budget (`fit_responses`, `fit_to_budget`,
  `fit_prompt`, `TRUNCATION_MARKER`; METHOD 4).
"""
