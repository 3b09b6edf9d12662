"""The book's tiny LLaMA as a Hugging Face ``LlamaForCausalLM``: same weights, same logits, no download.

Part 5 holds every engine it builds against a real library. ``transformers``
builds a ``LlamaForCausalLM`` from a ``LlamaConfig`` alone, and its state dict
names map one to one onto :class:`utils.attention.llama.TinyLlama`'s:

=====================================  ==========================================
``TinyLlama``                          ``LlamaForCausalLM``
=====================================  ==========================================
``embed.weight``                       ``model.embed_tokens.weight``
``blocks.i.attn_norm``                 ``model.layers.i.input_layernorm.weight``
``blocks.i.attn.w{q,k,v,o}.weight``    ``model.layers.i.self_attn.{q,k,v,o}_proj.weight``
``blocks.i.ffn_norm``                  ``model.layers.i.post_attention_layernorm.weight``
``blocks.i.w1 / w3 / w2``              ``model.layers.i.mlp.gate_proj / up_proj / down_proj``
``norm``                               ``model.norm.weight``
``out.weight``                         ``lm_head.weight``
=====================================  ==========================================

Hugging Face's attention rotates NeoX pairs ``(i, i + d/2)``. A model with the
book's default interleaved RoPE has its ``W_q`` and ``W_k`` rows permuted on the
way (:func:`utils.attention.rope.permute_rows_to_neox`, what Hugging Face's own
``convert_llama_weights_to_hf.py`` does to Meta's checkpoints), so both layouts
convert to the same logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from utils.attention.llama import TinyLlama
from utils.attention.rope import permute_rows_to_neox

if TYPE_CHECKING:  # transformers is imported only when a conversion runs
    from transformers import LlamaForCausalLM

__all__ = ["hf_config", "hf_continuous_batching", "hf_state_dict", "to_hf_llama"]


def hf_config(model: TinyLlama, max_position_embeddings: int = 4096):
    """The ``transformers.LlamaConfig`` with ``model``'s sizes: untied embeddings, no biases, its RoPE base.

    No beginning- or end-of-sequence token is set (Hugging Face's defaults are 1 and 2): the book's tiny models
    have none, and ``generate`` would otherwise stop wherever the model happens to emit token 2.
    """
    from transformers import LlamaConfig as HFLlamaConfig

    c = model.config
    return HFLlamaConfig(vocab_size=c.vocab, hidden_size=c.dim, intermediate_size=c.hidden,
                         num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                         num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.eps, rope_theta=c.rope_base,
                         max_position_embeddings=max_position_embeddings, tie_word_embeddings=False,
                         attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None)


def hf_state_dict(model: TinyLlama) -> dict[str, torch.Tensor]:
    """``model``'s weights under Hugging Face's names, ``W_q``/``W_k`` in the NeoX layout (detached copies)."""
    c = model.config

    def qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
        return weight if c.rope_layout == "neox" else permute_rows_to_neox(weight, n_heads)

    state = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm,
             "lm_head.weight": model.out.weight}
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": block.attn_norm,
            p + "post_attention_layernorm.weight": block.ffn_norm,
            p + "self_attn.q_proj.weight": qk(block.attn.wq.weight, c.n_heads),
            p + "self_attn.k_proj.weight": qk(block.attn.wk.weight, c.n_kv_heads),
            p + "self_attn.v_proj.weight": block.attn.wv.weight,
            p + "self_attn.o_proj.weight": block.attn.wo.weight,
            p + "mlp.gate_proj.weight": block.w1.weight,
            p + "mlp.up_proj.weight": block.w3.weight,
            p + "mlp.down_proj.weight": block.w2.weight,
        })
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def to_hf_llama(model: TinyLlama, max_position_embeddings: int = 4096) -> "LlamaForCausalLM":
    """A ``transformers.LlamaForCausalLM`` in eval mode with ``model``'s weights, dtype and device.

    Its logits equal ``model``'s up to float rounding (the tests hold them to 1e-5 in fp32).
    """
    if not isinstance(model, TinyLlama):
        raise ValueError(f"model must be a utils.attention.llama.TinyLlama, got {type(model).__name__}")
    from transformers import LlamaForCausalLM

    param = next(model.parameters())
    hf = LlamaForCausalLM(hf_config(model, max_position_embeddings))
    hf.load_state_dict(hf_state_dict(model), strict=True)
    return hf.to(device=param.device, dtype=param.dtype).eval()


def hf_continuous_batching(hf_model: "LlamaForCausalLM", requests: list[tuple[list[int], int]],
                           page_size: int = 16, num_blocks: int = 64, max_batch_tokens: int = 64) -> list[list[int]]:
    """Greedy tokens of ``requests`` (``(prompt, max_new_tokens)`` pairs) from ``transformers``' continuous batching.

    ``generate_batch`` (transformers >= 5) runs its own scheduler over its own paged cache in a background
    thread and returns when every request is done. It takes one ``max_new_tokens`` per call, so requests are
    grouped by it; the outputs come back in the order of ``requests``. No end-of-sequence token is set, so every
    request runs to its length, as :class:`utils.serving.runtime.engine.Engine`'s do.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    import logging

    if not requests:
        return []
    outputs: list[list[int] | None] = [None] * len(requests)
    cb_logger = logging.getLogger("ContinuousBatchingLogger")  # transformers' continuous_batching/utils.py
    level = cb_logger.level
    cb_logger.setLevel(logging.ERROR)  # its notice that no end-of-sequence token is set
    try:
        for n_new in sorted({n for _, n in requests}):
            chosen = [i for i, (_, n) in enumerate(requests) if n == n_new]
            config = GenerationConfig(max_new_tokens=n_new, do_sample=False, pad_token_id=0)
            batching = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks,
                                                max_batch_tokens=max_batch_tokens)
            results = hf_model.generate_batch(inputs=[list(requests[i][0]) for i in chosen], generation_config=config,
                                              continuous_batching_config=batching, warmup=False)
            ordered = sorted(results.values(), key=lambda r: int(r.request_id.rsplit("_", 1)[-1]))
            for i, result in zip(chosen, ordered):
                if list(result.prompt_ids) != list(requests[i][0]):
                    raise RuntimeError(f"transformers returned request {result.request_id} out of order")
                outputs[i] = list(result.generated_tokens)
    finally:
        cb_logger.setLevel(level)
    return outputs
