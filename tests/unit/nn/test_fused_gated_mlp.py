"""Neuron growth in a gated MLP whose gate and up projections are one layer, cut in halves in
its forward (Phi-3's, Phi-4-mini's and GLM's ``gate_up_proj``, ModernBERT's ``Wi``). A neuron
is one row in each half: the rows are appended (the optimizer carry, the rewind and the
dendrite banks keep their order) and the layer's output is put back in the order the block
reads. Before, the layer was refused ("a fused gate-and-up projection")."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import perfora
from perfora.nn.perforation import layer_specs, rebuild_structure
from tests.support.widening import (
    FusedGatedMLP,
    grow_a_trained_dendrite_set,
    known_pair,
    one_neuron_step,
)

T = pytest.importorskip("transformers", reason="transformers not installed")

IDS = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, pad_token_id=0)


def _build(name: str, head: bool = False) -> tuple[torch.nn.Module, str]:
    """A tiny model and its first fused gate-and-up layer."""
    torch.manual_seed(0)
    if name == "phi3":
        config = T.Phi3Config(num_key_value_heads=2, **SIZES)
        model = T.Phi3ForCausalLM(config) if head else T.Phi3Model(config)
        return model, ("model." if head else "") + "layers.0.mlp.gate_up_proj"
    if name == "granite4":  # the shared expert of Granite 4 (a hybrid Mamba MoE)
        config = T.GraniteMoeHybridConfig(
            num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1,
            shared_intermediate_size=64, layer_types=["mamba", "attention"], mamba_d_state=4,
            mamba_n_heads=4, mamba_d_head=16, **SIZES)
        return T.GraniteMoeHybridModel(config), "layers.0.shared_mlp.input_linear"
    config = T.ModernBertConfig(bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                sep_token_id=2, **SIZES)
    return T.ModernBertModel(config), "layers.0.mlp.Wi"


def _out(model: torch.nn.Module) -> torch.Tensor:
    out = model(input_ids=IDS)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("name", ["phi3", "modernbert", "granite4"])
@pytest.mark.parametrize("dendrites", [False, True])
def test_the_fused_layer_grows_neurons_exactly_exports_and_rewinds(name, dendrites):
    model, fused = _build(name)
    model, reader = known_pair(model, fused)
    plan = perfora.plan_widening(model)
    assert plan.layers[fused].found_by == "fused gated MLP"
    assert f"{fused} (2 rows per neuron) -> {reader}  [fused gated MLP]" in str(plan)
    if dendrites:
        grow_a_trained_dendrite_set(model, lambda: _out(model).square().mean())
    specs, state = copy.deepcopy(layer_specs(model)), copy.deepcopy(model.state_dict())
    with torch.no_grad():
        before = _out(model)
    perfora.widen(model, fused, 4)
    perfora.widen(model, fused, 8)  # two blocks: the order must hold across both
    layer = model.get_submodule(fused)
    assert layer.source.out_features == 2 * (64 + 12)
    assert model.get_submodule(reader).source.in_features == 64 + 12
    after = _out(model)
    assert torch.equal(after, before)
    after.square().sum().backward()  # the new neurons reach the reader: its new columns learn
    assert model.get_submodule(reader).source.weight.grad[:, 64:].abs().sum() > 0
    exported = perfora.export(model).eval()  # dendrites export as one GEMM: float rounding
    assert not any(type(m).__module__.startswith("perfora") for m in exported.modules())
    with torch.no_grad():
        assert torch.allclose(_out(exported), after, atol=1e-6)
    rebuild_structure(model, specs)  # the rewind to a best model from before the steps
    model.load_state_dict(state)
    assert model.get_submodule(fused).source.out_features == 128
    with torch.no_grad():
        assert torch.equal(_out(model), before)


def test_the_block_reads_each_new_neuron_as_a_gate_row_and_an_up_row():
    # the rows appended for neuron j are gate row j then up row j of the new block: setting
    # them and the reader's column by hand gives what a Phi-3 MLP of that width computes
    model, fused = _build("phi3")
    model = perfora.perforate(model.eval())
    mlp = model.get_submodule(fused.rpartition(".")[0])
    perfora.widen(model, fused, 2)
    perfora.widen(model, fused, 3)
    weight = mlp.gate_up_proj.source.weight.detach()
    blocks = [(0, 64), (128, 2), (132, 3)]  # (first row, neurons) of each widening's block
    gate = torch.cat([weight[s:s + n] for s, n in blocks])
    up = torch.cat([weight[s + n:s + 2 * n] for s, n in blocks])
    with torch.no_grad():
        mlp.down_proj.source.weight[:, 64:] = torch.randn(32, 5)
        h = torch.randn(3, 32)
        plain = mlp.down_proj.source.weight @ (
            torch.nn.functional.silu(h @ gate.T) * (h @ up.T)).T
        assert torch.allclose(mlp(h), plain.T, atol=1e-5)
        exported = perfora.export(model)
    rows = exported.get_submodule(fused).weight  # forward order: every gate row, then up
    assert torch.equal(rows, torch.cat([gate, up]))


def test_an_exported_phi3_reloads_with_from_pretrained(tmp_path):
    model, fused = _build("phi3", head=True)
    model = perfora.perforate(model.eval())
    for layer in range(2):
        perfora.widen(model, f"model.layers.{layer}.mlp.gate_up_proj", 5)
    exported = perfora.export(model)
    assert exported.config.intermediate_size == 69
    exported.save_pretrained(tmp_path)
    loaded = T.Phi3ForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=IDS).logits, exported(input_ids=IDS).logits)
        assert torch.allclose(exported(input_ids=IDS).logits, model(input_ids=IDS).logits,
                              atol=1e-6)


def test_a_controller_step_adds_the_start_width_in_neurons_and_saves_and_loads(tmp_path):
    model, fused = _build("phi3")
    model = perfora.perforate(model)
    decision, before = one_neuron_step(model, IDS, neuron_init="gradmax")
    grown = decision.model.eval()
    layer = grown.get_submodule(fused)
    assert layer.source.out_features == 2 * 128  # 64 neurons: a row in each half
    assert "gate_up_proj: +64 random" in decision.reason  # GradMax pairs no rows here
    with torch.no_grad():
        assert torch.equal(grown(input_ids=IDS).last_hidden_state, before.last_hidden_state)
        perfora.save_model(tmp_path / "phi3.safetensors", grown)
        loaded = perfora.load_model(_build("phi3")[0], tmp_path / "phi3.safetensors").eval()
        assert torch.equal(loaded(input_ids=IDS).last_hidden_state,
                           grown(input_ids=IDS).last_hidden_state)


def test_a_plain_state_dict_of_a_grown_fused_layer_is_refused_with_load_model():
    # its rows' order depends on the widenings, which a state dict does not record
    model, fused = _build("phi3")
    grown = perfora.perforate(model)
    perfora.widen(grown, fused, 4)
    fresh = perfora.perforate(_build("phi3")[0])
    with pytest.raises(perfora.PerforationError, match="perfora.load_model"):
        fresh.load_state_dict(grown.state_dict())
    assert fresh.get_submodule(fused).source.out_features == 128  # nothing was changed


def test_the_weights_of_a_grown_fused_layer_alone_are_refused_by_load_grown_pretrained(tmp_path):
    # weights saved without the config: nothing says in which steps the layer grew
    from perfora.integrations.transformers import load_grown_pretrained

    safetensors = pytest.importorskip("safetensors.torch")
    model, fused = _build("phi3")
    grown = perfora.perforate(model)
    perfora.widen(grown, fused, 4)
    safetensors.save_file(grown.state_dict(), str(tmp_path / "model.safetensors"))
    fresh = _build("phi3")[0]
    with pytest.raises(perfora.PerforationError, match=f"{fused} is a fused gate-and-up layer"
                       r".*config.json's perfora_fused_widenings"):
        load_grown_pretrained(fresh, tmp_path)
    assert fresh.get_submodule(fused).source.out_features == 128  # nothing was changed


@pytest.mark.parametrize("name", ["phi3", "modernbert"])
@pytest.mark.parametrize("dendrites", [False, True])
def test_a_save_pretrained_folder_of_a_grown_fused_layer_reloads_to_the_bit(tmp_path, name,
                                                                           dendrites):
    # the config records the widening steps (4 then 8 neurons: a one-step widening of 12
    # would read the first step's up rows as gate rows), load_grown_pretrained replays them
    from perfora.integrations.transformers import load_grown_pretrained

    model, fused = _build(name)
    grown = perfora.perforate(model)
    if dendrites:
        grown.get_submodule(fused).grow()
    perfora.widen(grown, fused, 4)
    perfora.widen(grown, fused, 8)
    with torch.no_grad():  # trained values, so the new rows and columns are not zero
        for p in grown.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    assert grown.config.perfora_fused_widenings == {fused: [4, 8]}
    grown.save_pretrained(tmp_path)
    config = type(grown.config).from_pretrained(tmp_path)
    fresh = load_grown_pretrained(type(model)(config), tmp_path)
    assert fresh.get_submodule(fused).num_dendrites == int(dendrites)
    assert torch.equal(_out(fresh.eval()), _out(grown.eval()))


def test_the_record_follows_the_rewind_and_an_exported_config_has_none(tmp_path):
    from perfora.nn.narrowing import narrow_widenings

    model, fused = _build("phi3")
    grown = perfora.perforate(model)
    perfora.widen(grown, fused, 4)
    perfora.widen(grown, fused, 8)
    narrow_widenings(grown, fused, 1)
    assert grown.config.perfora_fused_widenings == {fused: [4]}
    exported = perfora.export(grown)
    assert not hasattr(exported.config, "perfora_fused_widenings")
    assert grown.config.perfora_fused_widenings == {fused: [4]}  # the export copied the config
    narrow_widenings(grown, fused, 0)
    assert not hasattr(grown.config, "perfora_fused_widenings")


def test_a_record_that_does_not_match_the_weights_is_refused_before_anything_changes(tmp_path):
    from perfora.integrations.transformers import load_grown_pretrained

    model, fused = _build("phi3")
    grown = perfora.perforate(model)
    perfora.widen(grown, fused, 4)
    grown.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["perfora_fused_widenings"] = {fused: [2, 4]}  # 12 rows, the weight has 8 more
    (tmp_path / "config.json").write_text(json.dumps(config))
    fresh = _build("phi3")[0]
    with pytest.raises(perfora.PerforationError, match="different runs"):
        load_grown_pretrained(fresh, tmp_path)
    assert fresh.get_submodule(fused).source.out_features == 128
    config["perfora_fused_widenings"] = {fused: "4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(perfora.PerforationError, match="lists of positive neuron counts"):
        load_grown_pretrained(_build("phi3")[0], tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(perfora.CheckpointError, match="config.json is not JSON"):
        load_grown_pretrained(_build("phi3")[0], tmp_path)


def test_a_record_written_from_the_inner_model_reloads_the_outer_one(tmp_path):
    # a controller given Phi3Model (DendriteGrowthCallback(module="model")) writes paths
    # inside it into the config it shares with Phi3ForCausalLM
    from perfora.integrations.transformers import load_grown_pretrained

    model, fused = _build("phi3", head=True)
    perfora.perforate(model.model)
    perfora.widen(model.model, "layers.0.mlp.gate_up_proj", 4)
    perfora.widen(model.model, "layers.0.mlp.gate_up_proj", 8)
    assert model.config.perfora_fused_widenings == {"layers.0.mlp.gate_up_proj": [4, 8]}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    model.save_pretrained(tmp_path)
    fresh = T.Phi3ForCausalLM(T.Phi3Config.from_pretrained(tmp_path))
    fresh = load_grown_pretrained(fresh, tmp_path, module="model")
    assert fresh.get_submodule(fused).source.out_features == 2 * (64 + 12)
    assert torch.equal(_out(fresh.eval()), _out(model.eval()))


class _GateReadTwice(torch.nn.Module):
    """Named like Phi-3's MLP, but the gate half also feeds a mean over all neurons."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(8, 32)
        self.down_proj = torch.nn.Linear(16, 8)
        self.activation_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * self.activation_fn(gate) + gate.mean(-1, keepdim=True))


class _Untraceable(FusedGatedMLP):
    """Phi-3's MLP with a branch on a value: torch.fx cannot trace it, so nothing shows how
    the fused output is cut (it could be interleaved rows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if x.sum() > 0 else super().forward(-x)


def test_a_block_that_reads_the_fused_output_otherwise_is_refused():
    model = perfora.perforate(torch.nn.Sequential(_GateReadTwice()))
    why = perfora.plan_widening(model).refused["0.gate_up_proj"]
    assert why.startswith("0.gate_up_proj's output also goes to")
    assert why.endswith("which the fused gated MLP pattern does not have")  # no pairs= hint
    with pytest.raises(perfora.PerforationError, match="pattern does not have"):
        perfora.widen(model, "0.gate_up_proj", 2)


def test_a_trainer_run_resumed_after_a_neuron_step_ends_with_the_same_weights(tmp_path):
    # the checkpoint's controller file replays the widenings, so the rows' order comes back
    pytest.importorskip("accelerate")
    from perfora.integrations.transformers import DendriteGrowthCallback

    ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(1))
    examples = [{"input_ids": row, "labels": row} for row in ids]

    def trainer(out):
        args = T.TrainingArguments(
            output_dir=str(out), num_train_epochs=3, per_device_train_batch_size=4,
            learning_rate=1e-3, eval_strategy="epoch", save_strategy="epoch",
            logging_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True, seed=0)
        run = T.Trainer(model=_build("phi3", head=True)[0].train(), args=args,
                        train_dataset=examples, eval_dataset=examples[:4])
        DendriteGrowthCallback(monitor="eval_loss", growth="neurons", max_neuron_steps=2,
                               switch_mode="fixed", fixed_switch_num=1, write_files=False,
                               restore_best_at_end=False, seed=0).bind(run)
        return run

    whole = trainer(tmp_path / "run")
    whole.train()
    assert whole.model.get_submodule("model.layers.0.mlp.gate_up_proj").source.out_features \
        == 2 * (64 + 64 + 64)  # two steps of 64 neurons, each a gate row and an up row
    resumed = trainer(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    for (name, a), (_, b) in zip(sorted(whole.model.state_dict().items()),
                                 sorted(resumed.model.state_dict().items()), strict=True):
        assert torch.equal(a, b), name
    # and trainer.save_model's folder reloads into a model built from its config
    from perfora.integrations.transformers import load_grown_pretrained

    whole.save_model(str(tmp_path / "saved"))
    config = T.Phi3Config.from_pretrained(tmp_path / "saved")
    loaded = load_grown_pretrained(T.Phi3ForCausalLM(config), tmp_path / "saved")
    for (name, a), (_, b) in zip(sorted(whole.model.state_dict().items()),
                                 sorted(loaded.state_dict().items()), strict=True):
        assert torch.equal(a, b), name


def test_pairs_for_a_fused_layer_is_refused_with_the_way_it_is_found():
    # a list of readers cannot say that each neuron is a row in each half
    model, fused = _build("phi3")
    model = perfora.perforate(model)
    reader = fused.replace("gate_up_proj", "down_proj")
    with pytest.raises(perfora.PerforationError, match="leave layers.0.mlp.gate_up_proj out of "
                                                       "pairs= and the block is found"):
        perfora.widen(model, fused, 4, pairs={fused: [reader]})
    assert model.get_submodule(fused).source.out_features == 128


def test_a_fused_block_that_does_not_trace_is_refused():
    # names and widths alone would let an interleaved gate-and-up layer be widened wrongly
    model = perfora.perforate(torch.nn.Sequential(_Untraceable(8, 16)))
    why = perfora.plan_widening(model).refused["0.gate_up_proj"]
    assert why == ("the block does not trace with torch.fx, so how it cuts 0.gate_up_proj's "
                   "output into 2 parts is not known")
    assert "0.gate_up_proj" in perfora.plan_widening(
        perfora.perforate(torch.nn.Sequential(FusedGatedMLP(8, 16)))).widenable


def test_a_config_that_takes_no_record_warns_and_growth_goes_on():
    # growth must not fail over the record: the warning names the way to reload instead
    class NoExtras(T.Phi3Config):
        def __setattr__(self, key, value):
            if key == "perfora_fused_widenings":
                raise TypeError(f"{key}: not a field of this config")
            super().__setattr__(key, value)

    torch.manual_seed(0)
    grown = perfora.perforate(T.Phi3Model(NoExtras(num_key_value_heads=2, **SIZES)))
    fused = "layers.0.mlp.gate_up_proj"
    with pytest.warns(UserWarning, match="perfora.save_model"):
        perfora.widen(grown, fused, 4)
    assert grown.get_submodule(fused).source.out_features == 2 * (64 + 4)
    assert not hasattr(grown.config, "perfora_fused_widenings")


def test_the_record_names_layers_as_the_state_dict_does_inside_wrappers():
    # FSDP1 and activation checkpointing put a wrapper segment into each wrapped path
    from perfora.nn.fused_record import fused_steps

    inner = perfora.perforate(torch.nn.Sequential(torch.nn.Linear(4, 8), FusedGatedMLP(8, 16)))
    perfora.widen(inner, "1.gate_up_proj", 4)
    outer, middle = torch.nn.Module(), torch.nn.Module()
    middle.add_module("_checkpoint_wrapped_module", inner)
    outer.add_module("_fsdp_wrapped_module", middle)
    assert fused_steps(outer) == {"1.gate_up_proj": [4]}
