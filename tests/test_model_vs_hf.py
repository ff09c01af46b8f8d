"""paracube's own GPT, built from a Hugging Face config's shape, computes what
``transformers``' model of that family computes given the same weights — the rotary base,
the per-head q and k norms before the rotary positions, grouped-query attention, the
decoupled head size, SwiGLU's gate and up, GPT-2's learned positions, biases and Conv1D
layout, the norms' epsilon and a tied embedding are the family's, not look-alikes. So a
preset written from a model card (``llama3-8b``, ``qwen3-8b``) trains that model's function,
and ``paracube import`` (:mod:`paracube.models.hf_convert`) starts paracube's GPT from a
Hugging Face checkpoint: trained under a layout it gives the HF model's own losses.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from paracube.models.gpt import GPT
from paracube.models.hf_convert import gpt_weights, imported_config
from paracube.models.sources import read_hf_config
from tests.helpers import assert_losses_close
from tests.test_hf_models import model_dir

pytest.importorskip("transformers")

SEQ = 32
FAMILIES = ["llama", "qwen3", "mistral", "gpt2", "llama31", "qwen2"]


def _random_biases(model: torch.nn.Module) -> None:
    """Every bias drawn from N(0, 1): both libraries start them at zero, where a bias put
    in the wrong rows (or left in HF's rotary order) would compute the same function."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()


def _hf_and_gpt(family: str, dtype=torch.float64):
    """The family's tiny HF model with weights from seed 0, and paracube's GPT (of the
    imported config's shape) holding the same weights."""
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import hf_config_object

    directory = model_dir(family)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_object(directory), dtype=dtype)
    _random_biases(hf)
    data = read_hf_config(directory)
    cfg = imported_config(data)
    gpt = GPT(cfg).to(dtype)
    weights = gpt_weights(hf.state_dict(), cfg, data["model_type"])
    return hf, gpt, cfg, weights


@pytest.mark.parametrize("family", FAMILIES)
def test_paracubes_gpt_computes_the_hf_models_function(family):
    """Same weights, same tokens, float64: the logits agree to 1e-6 — the rounding of HF's
    RMSNorm, which computes in float32 whatever the model's dtype (HF's rotary order kept
    moves them by 6e-3 to 0.3, below; a rotary base 3× off by 2e-3 to 8e-2) — and the
    converted weights fill every parameter of paracube's GPT, a tied head by the embedding."""
    hf, gpt, cfg, weights = _hf_and_gpt(family)
    missing, unexpected = gpt.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) == ({"head.weight"} if cfg.tie_embeddings else set())
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        want, got = hf(input_ids=tokens).logits, gpt(tokens)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("family", "change"),
    [("qwen3", "hf-rotary-order"), ("qwen3", "rotary-base"), ("llama31", "no-stretch")],
)
def test_a_wrong_rotary_layout_base_or_stretch_is_seen(family, change):
    """The check above can fail: Qwen3's q and k rows left in HF's rotary order, the GPT
    built with a rotary base 3× the config's, or Llama 3.1's without its stretched
    frequencies, give other logits."""
    hf, _, cfg, weights = _hf_and_gpt(family)
    if change == "rotary-base":
        cfg = dataclasses.replace(cfg, rope_theta=3 * cfg.rope_theta)
    elif change == "no-stretch":
        cfg = dataclasses.replace(cfg, rope_scaling="none")
    else:
        for i in range(cfg.n_layers):
            attn = hf.model.layers[i].self_attn
            weights[f"blocks.{i}.attn.qkv_proj.weight"] = torch.cat(
                (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
            ).detach()
    gpt = GPT(cfg).to(torch.float64)
    gpt.load_state_dict(weights)
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        gap = (gpt(tokens) - hf(input_ids=tokens).logits).abs().max()
    assert gap > 1e-3


def _saved_hf(family: str, folder) -> str:
    """The family's tiny HF model, weights from seed 0, saved as from_pretrained loads it."""
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import hf_config_object

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_object(model_dir(family)))
    _random_biases(hf)
    hf.save_pretrained(str(folder))
    return str(folder)


def _losses(cfg):
    """One rank's losses; from the imported weights where the job has them (as
    ``paracube.train`` starts a run with ``--init-from``)."""
    from paracube.checkpoint.export import init_from, read_exported
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from tests.helpers import small_corpus

    torch.set_num_threads(1)
    trainer = Trainer(cfg, ProcessMesh(cfg.parallel), small_corpus())
    if cfg.checkpoint.init_from is not None:
        init_from(trainer, read_exported(cfg.checkpoint.init_from)[1])
    return [trainer.train_step().loss for _ in range(cfg.steps)]


@pytest.mark.parametrize(
    ("family", "layout"),
    [
        ("llama31", dict(tp=2, sequence_parallel=True)),
        ("gpt2", dict(dp=2)),
        ("qwen2", dict(tp=2, sequence_parallel=True)),  # q, k and v biases split by tp
    ],
)
def test_an_imported_model_trains_as_the_hf_model(pools, tmp_path, capsys, family, layout):
    """``paracube import`` (the command line for the Llama 3.1, the library call for GPT-2
    and Qwen2) then ``--init-from``: paracube's GPT from the HF checkpoint, under a layout, gives step
    for step the losses of the HF module itself trained from the same checkpoint
    (``--model hf:DIR``) under that layout — the engine's rotary tables (built on the meta
    device, then materialized) at the model's base and stretch."""
    from paracube.config import ParallelConfig, TrainConfig
    from paracube.models.hf_convert import import_hf
    from paracube.models.sources import hf_model_config
    from paracube.options import CheckpointConfig

    directory = _saved_hf(family, tmp_path / family)
    out = tmp_path / f"{family}.safetensors"
    if family == "llama31":
        from paracube.cli import main

        assert main(["import", f"hf:{directory}", "--out", str(out)]) == 0
        assert f"paracube train --init-from {out}" in capsys.readouterr().out
    else:
        import_hf(directory, str(out))
    par = ParallelConfig(bucket_mb=0.05, **layout)
    common = dict(parallel=par, steps=4, micro_batch=8 // par.dp, warmup_steps=2, progress=False)
    as_hf = TrainConfig(
        model=hf_model_config(read_hf_config(directory), SEQ),
        model_source=f"hf:{directory}",
        **common,
    )
    imported = TrainConfig(
        model=imported_config(read_hf_config(directory)).replace(seq_len=SEQ),
        checkpoint=CheckpointConfig(init_from=str(out)),
        **common,
    )
    want = pools(par.world_size).run(_losses, as_hf)[0]
    got = pools(par.world_size).run(_losses, imported)[0]
    assert_losses_close(got, want)


def test_init_from_without_a_model_trains_the_files_model(tmp_path):
    """``paracube train --init-from FILE`` with no ``--model``: the model is the one the
    file's weights are of (its header), at ``--seq-len``; paracube's own GPT, not the HF
    module; without either flag the default preset."""
    from paracube.cli import build_parser, config_from_args
    from paracube.models.hf_convert import import_hf

    directory = _saved_hf("qwen3", tmp_path / "qwen3")
    out = str(tmp_path / "qwen3.safetensors")
    import_hf(directory, out)
    cfg = config_from_args(
        build_parser().parse_args(["train", "--init-from", out, "--seq-len", "32"])
    )
    assert cfg.model == imported_config(read_hf_config(directory)).replace(seq_len=32)
    assert cfg.model_source is None and cfg.model.qk_norm
    assert config_from_args(build_parser().parse_args(["train"])).model.name == "tiny"


def test_a_sharded_checkpoint_loads_and_imports_as_its_one_file(tmp_path):
    """The same weights saved whole (model.safetensors) and in shards (an index and
    model-0000i-of-0000n.safetensors, as every published multi-billion model is): the
    HF model paracube builds from each holds the same tensors, and each imports to the
    same file."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from paracube.models.hf import build_hf, hf_config_object
    from paracube.models.hf_convert import import_hf
    from paracube.models.sources import WEIGHTS_INDEX, hf_model_config, hf_weight_files

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config_object(model_dir("llama")))
    whole, sharded = str(tmp_path / "whole"), str(tmp_path / "sharded")
    hf.save_pretrained(whole)
    hf.save_pretrained(sharded, max_shard_size="200KB")
    assert (tmp_path / "sharded" / WEIGHTS_INDEX).is_file() and len(hf_weight_files(sharded)) > 2
    shape = hf_model_config(read_hf_config(whole), SEQ)
    built = [dict(build_hf(d, shape).module.named_parameters()) for d in (whole, sharded)]
    assert built[0].keys() == built[1].keys()
    for name, p in built[0].items():
        assert torch.equal(p, built[1][name]), name
    for name, p in hf.named_parameters():  # the saved values, not the seed's fresh ones
        assert torch.equal(built[1][name], p), name
    for d in (whole, sharded):
        import_hf(d, d + ".safetensors")
    a, b = load_file(whole + ".safetensors"), load_file(sharded + ".safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# paracube GPTs of each shape a Hugging Face architecture holds
LLAMA_SHAPE = dict(norm="rmsnorm", activation="swiglu", position="rope", bias=False,
                   n_kv_heads=2, ffn_hidden=96)  # fmt: skip
EXPORTED = {
    "gpt2": dict(),  # nano itself: LayerNorm, GELU, learned positions, biases
    "gpt2-tied": dict(tie_embeddings=True),
    "llama": dict(LLAMA_SHAPE, rope_theta=500000.0),
    "llama31-biased": dict(
        LLAMA_SHAPE,
        bias=True,
        rope_theta=500000.0,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_context=64,
    ),  # fmt: skip
    "qwen3-tied": dict(LLAMA_SHAPE, qk_norm=True, head_size=32, tie_embeddings=True),
    "qwen2": dict(LLAMA_SHAPE, qkv_bias=True),  # q, k and v alone biased
}


@pytest.mark.parametrize("shape", list(EXPORTED))
def test_paracubes_gpt_exports_as_the_hf_model(shape):
    """paracube's GPT as the Hugging Face model of its shape (``paracube export CKPT --out
    FOLDER``): transformers' model built from the exported config, holding the exported
    weights, computes the GPT's logits to 1e-6; and importing them back gives the GPT's
    weights exactly."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from paracube.models.hf_convert import hf_config_of, hf_weights
    from paracube.models.presets import preset

    cfg = preset("nano", seq_len=SEQ, **EXPORTED[shape])
    torch.manual_seed(0)
    gpt = GPT(cfg).to(torch.float64)
    _random_biases(gpt)
    ours = {n: p.detach() for n, p in gpt.named_parameters()}
    data = hf_config_of(cfg)
    hf_cfg = AutoConfig.for_model(**data)
    hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float64)
    state = hf_weights(ours, cfg)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # a tied head is the embedding's own tensor: none of its own in the state
    assert not unexpected and set(missing) == ({"lm_head.weight"} if cfg.tie_embeddings else set())
    tokens = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, gpt(tokens), rtol=1e-5, atol=1e-6)
    back = gpt_weights(state, cfg, data["model_type"])
    assert back.keys() == ours.keys() and all(torch.equal(back[n], ours[n]) for n in ours)


def test_a_trained_gpt_exports_to_a_folder_transformers_loads(tmp_path):
    """``paracube train --save-dir`` then ``paracube export CKPT --out FOLDER``:
    ``from_pretrained`` loads the folder and computes the logits of the GPT that the
    ``.safetensors`` export of the same checkpoint loads into."""
    from transformers import AutoModelForCausalLM

    from paracube.checkpoint.export import load_into, read_exported
    from paracube.cli import main
    from tests.test_cli import run_cli

    ckpt = tmp_path / "ckpt"
    done = run_cli(
        "train", "--model", "nano", "--steps", "2", "--save-dir", str(ckpt), "--no-progress"
    )
    assert done.returncode == 0, done.stderr
    assert main(["export", str(ckpt), "--out", str(tmp_path / "w.safetensors")]) == 0
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    cfg, tensors = read_exported(str(tmp_path / "w.safetensors"))
    gpt = GPT(cfg)
    load_into(gpt, tensors)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, gpt(tokens), rtol=1e-4, atol=1e-5)


@pytest.mark.in_process
@pytest.mark.parametrize(
    "kind", ["gemma", "gemma2", "gemma3_text", "gemma3", "gpt_oss", "llama4_text", "llama4"]
)
def test_a_model_paracubes_gpt_cannot_compute_is_not_imported(kind):
    """Gemma's GeGLU, (1 + w) norms and √h embedding, and the mixtures, are no paracube GPT:
    imported, their weights would train another function. Refused by model type before any
    weight is read."""
    from paracube.errors import ConfigError

    with pytest.raises(ConfigError, match=f"paracube import: {kind} cannot be paracube's GPT"):
        imported_config({"model_type": kind, "hidden_size": 64, "num_attention_heads": 4})


@pytest.mark.in_process
def test_a_config_with_a_part_only_the_planner_models_is_not_imported():
    """Whatever the model type, a shape with a part paracube's GPT does not build — here a
    Mistral's window shorter than its context — is refused by name."""
    from paracube.errors import ConfigError

    windowed = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4,
                "num_hidden_layers": 2, "sliding_window": 16, "max_position_embeddings": 64}  # fmt: skip
    with pytest.raises(ConfigError, match="attention_window=16 .*planned but not built"):
        imported_config(windowed)
