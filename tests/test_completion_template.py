"""/v1/completions reads a prompt as an instruct model was trained to: one user turn in
its chat template (``--raw-completions``: as written)."""

from modeswitch.engine.serving.schemas import CompletionBody
from modeswitch.engine.serving.tokens import completion_ids

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"


def test_a_templated_model_reads_the_prompt_as_a_user_turn(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    body = CompletionBody(prompt="What is the capital of France?")
    assert not tok.chat_template
    plain = completion_ids(tok, body)
    assert plain == tok(body.prompt, add_special_tokens=True)["input_ids"]
    tok.chat_template = TEMPLATE
    templated = completion_ids(tok, body)
    assert tok.decode(templated).startswith("[user] What is the capital of France?")
    assert tok.decode(templated).rstrip().endswith("[assistant]")
    assert completion_ids(tok, body, raw=True) == plain
    assert completion_ids(tok, CompletionBody(prompt="")) == []
