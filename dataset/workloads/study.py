"""The ModeSwitch-LLM study's workload shapes (arXiv 2605.23057).

Nominal sizes follow the published data's README: short/long prompt about
128/1024 tokens, short/long output 32/128; shared-prefix chat has a ~1024-token
common prefix and a 64-token answer (the suffix length was not published; 64 is
our assumption); memory pressure is a 2048/128 request with half of the free
accelerator memory taken beforehand.

Each family's text (``questions`` end the prompt; ``context`` suites' worked examples
fill it to length and make up the shared prefix): short answers come from
multiple-choice questions (TruthfulQA, MMLU-Pro), long answers from open instructions
(AlpacaEval, MT-Bench) and GSM8K's worked arithmetic; long prompts are few-shot
prompts of MMLU-Pro, GPQA or GSM8K.
"""

from modeswitch.dataset.workloads import register_workload
from modeswitch.dataset.workloads.spec import WorkloadSpec

MULTIPLE_CHOICE = ("truthfulqa", "mmlu_pro")
OPEN = ("alpacaeval2_lc", "mt_bench", "gsm8k")

for _name, _p, _o, _desc, _q, _c in [
    ("short_prompt_short_output", 128, 32, "short prompt, short answer", MULTIPLE_CHOICE, ("truthfulqa",)),
    ("short_prompt_long_output", 128, 128, "short prompt, long answer (decode-heavy)", OPEN, ("gsm8k",)),
    ("long_prompt_short_output", 1024, 32, "long prompt, short answer (prefill-heavy)", ("mmlu_pro", "gpqa"),
     ("mmlu_pro", "gpqa")),
    ("long_prompt_long_output", 1024, 128, "long prompt, long answer", ("gsm8k",), ("gsm8k",)),
]:
    register_workload(WorkloadSpec(_name, _desc, "plain", _p, _o, questions=_q, context=_c))

register_workload(
    WorkloadSpec(
        "shared_prefix_chat",
        "chat turns sharing a long system/context prefix, per-request suffix",
        "shared_prefix",
        prompt_tokens=1024 + 64,
        expected_output_tokens=64,
        shared_prefix_tokens=1024,
        questions=("alpacaeval2_lc", "mt_bench"),
        context=("truthfulqa", "mmlu_pro"),
    )
)
register_workload(
    WorkloadSpec(
        "memory_pressure_long_context",
        "long context with half of the free accelerator memory taken beforehand",
        "memory_pressure",
        prompt_tokens=2048,
        expected_output_tokens=128,
        memory_pressure=0.5,
        questions=("gpqa", "mmlu_pro"),
        context=("mmlu_pro", "gpqa"),
    )
)
register_workload(
    WorkloadSpec(
        "batch_pressure",
        "several short requests arriving together",
        "batch_pressure",
        prompt_tokens=128,
        expected_output_tokens=64,
        concurrent_requests=8,
        questions=("alpacaeval2_lc", "truthfulqa"),
        context=("truthfulqa",),
    )
)
register_workload(
    WorkloadSpec(
        "long_context",
        "the study's long-context stress shapes (2048-4032 prompt tokens)",
        "plain",
        prompt_tokens=3840,
        expected_output_tokens=256,
        questions=("mmlu_pro", "gpqa"),
        context=("mmlu_pro", "gpqa"),
    )
)
register_workload(
    WorkloadSpec(
        "shared_prefix_long_context",
        "the study's shared-prefix stress shape (4032-token prompt, 64 new tokens); the "
        "prefix length was not published, 3840 is our assumption",
        "shared_prefix",
        prompt_tokens=4032,
        expected_output_tokens=64,
        shared_prefix_tokens=3840,
        questions=("mmlu_pro", "gpqa"),
        context=("mmlu_pro", "gpqa"),
    )
)
