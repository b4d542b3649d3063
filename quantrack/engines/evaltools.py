"""The engines' own evaluation tools, by the name a user gives them: quantrack reproduces the scoring of one
(``[eval] style``, ``quantrack eval --style``) and imports the result files of two (``quantrack eval import
--format``). Names only, so that the accuracy code and the study schema never spell an engine; what each tool does
is in quantrack.accuracy.gsm8k (scoring) and quantrack.accuracy.importers (files).
"""

from __future__ import annotations

# vLLM's GSM8K script, vllm@4ba787ec9:tests/evals/gsm8k/gsm8k_eval.py: its scoring (the last integer of the answer,
# the first train examples as shots, its stop strings and request seed) and its --save-results JSON
VLLM_GSM8K = "vllm"
# SGLang's run_eval / bench GSM8K result JSON (``score``; no question count)
SGLANG_RUN_EVAL = "sglang"
# the result-file formats `eval import --format` names after an engine's tool
ENGINE_RESULT_FORMATS = (VLLM_GSM8K, SGLANG_RUN_EVAL)

__all__ = ["ENGINE_RESULT_FORMATS", "SGLANG_RUN_EVAL", "VLLM_GSM8K"]
