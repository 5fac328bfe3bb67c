"""BERT against transformers' BertForPreTraining / BertForSequenceClassification / BertModel
(small random models saved with save_pretrained): logits, losses, every parameter gradient, both
layer-norm layouts, the checkpoint converter round trip and the loader's error paths."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import engine as flow
from libai.models import BertForPreTraining, BertForSequenceClassification, BertModel
from libai.models.utils import HFConfigError, load_logical_state_dict, logical_state_dict, read_safetensors
from libai.models.utils.hf_bert import libai_to_hf_bert

from gpt_hf_helpers import ROOT, randomize_biases_and_norms

HF_BERT = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               max_position_embeddings=32, type_vocab_size=2, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0)
LAYOUTS = [dict(), dict(layernorm_position="pre", apply_residual_post_layernorm=True)]
LAYOUT_IDS = ["post-LN", "pre-LN"]

RNG = np.random.default_rng(7)
TOKEN_TYPES = np.repeat((np.arange(16)[None] >= 9).astype(np.int64), 3, axis=0)
ATTENTION = np.ones((3, 16), np.int64)
ATTENTION[1, 11:] = 0  # padding in two rows
ATTENTION[2, 14:] = 0
# tokens 1.. at real positions, [PAD] (0, HF's pad_token_id) at padded ones and at one real
# position: HF's word embedding has padding_idx=0, which zeroes the lookup gradient of row 0
# (from_huggingface sets pad_token_id to match), and an attended [PAD] does reach the loss
IDS = np.where(ATTENTION == 1, RNG.integers(1, HF_BERT["vocab_size"], size=(3, 16)), 0)
IDS[0, 5] = 0


def make_hf(path, cls_name="BertForPreTraining", seed=0, **overrides):
    """A randomly initialised transformers BERT model saved (safetensors) in `path`."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(**{**HF_BERT, **overrides})
    model = getattr(transformers, cls_name)(cfg)
    randomize_biases_and_norms(model, "LayerNorm")
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    return model


@pytest.fixture(scope="module")
def hf_pretraining(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_bert_pretraining")
    return str(path), make_hf(path)


def hf_inputs():
    return dict(input_ids=torch.tensor(IDS), attention_mask=torch.tensor(ATTENTION),
                token_type_ids=torch.tensor(TOKEN_TYPES))


def our_inputs():
    return flow.tensor(IDS), flow.tensor(ATTENTION), flow.tensor(TOKEN_TYPES)


def mlm_labels():
    """HF-style labels (-100 = not predicted) at ~20% of the real tokens, and their loss mask."""
    rng = np.random.default_rng(3)
    chosen = (rng.random(IDS.shape) < 0.2) & (ATTENTION == 1)
    chosen[:, 1] = True  # at least one per row
    labels = np.where(chosen, rng.integers(0, HF_BERT["vocab_size"], IDS.shape), -100)
    return labels, chosen.astype(np.int64)


def maxabs(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_pretraining_logits_match_hf(hf_pretraining, layout):
    path, hf = hf_pretraining
    model = BertForPreTraining.from_huggingface(path, **layout)
    model.eval()
    with flow.no_grad():
        out = model(*our_inputs())
    ref = hf(**hf_inputs())
    real = ATTENTION.astype(bool)  # padded positions are never read (their values are arbitrary)
    err = maxabs(out["prediction_scores"].numpy()[real], ref.prediction_logits.detach().numpy()[real])
    err_sop = maxabs(out["seq_relationship_score"].numpy(), ref.seq_relationship_logits.detach().numpy())
    print(f"max abs error vs HF: prediction {err:.3g}, seq relationship {err_sop:.3g}")
    assert err < 1e-4 and err_sop < 1e-4


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_pretraining_loss_and_gradients_match_hf(hf_pretraining, layout, tmp_path):
    path, _ = hf_pretraining
    hf = make_hf(tmp_path / "copy")  # a fresh copy to train on
    hf.train()
    labels, loss_mask = mlm_labels()
    ns = np.array([0, 1, 1])
    ref = hf(**hf_inputs(), labels=torch.tensor(labels), next_sentence_label=torch.tensor(ns))
    ref.loss.backward()
    model = BertForPreTraining.from_huggingface(path, **layout)
    model.train()
    # the dataset's convention: -1 where nothing is predicted, with a loss mask
    out = model(*our_inputs(), ns_labels=flow.tensor(ns), lm_labels=flow.tensor(np.where(labels < 0, -1, labels)),
                loss_mask=flow.tensor(loss_mask))
    assert set(out) == {"total_loss", "lm_loss", "sop_loss", "sop_acc"}
    assert abs(out["total_loss"].item() - ref.loss.item()) < 1e-5
    assert abs(out["lm_loss"].item() + out["sop_loss"].item() - ref.loss.item()) < 1e-5
    logits = ref.seq_relationship_logits.detach().numpy()
    assert out["sop_acc"].item() == pytest.approx(float((logits.argmax(-1) == ns).mean()))
    out["total_loss"].backward()
    grads = {k: p.grad.numpy() for k, p in model.named_parameters()}
    hf_grads = libai_to_hf_bert(grads, model.bert.config)
    ref_grads = {k: p.grad.numpy() for k, p in hf.named_parameters() if p.grad is not None}
    assert sorted(hf_grads) == sorted(set(ref_grads) | {"cls.predictions.decoder.bias"})
    worst = max(maxabs(hf_grads[k], ref_grads[k]) / max(np.abs(ref_grads[k]).max(), 1e-6) for k in ref_grads)
    print(f"worst relative gradient error vs HF: {worst:.3g}")
    assert worst < 1e-4


def test_hf_style_labels_without_loss_mask(hf_pretraining):
    """Without loss_mask, negative labels (HF's -100) are ignored: the same loss as HF."""
    path, hf = hf_pretraining
    model = BertForPreTraining.from_huggingface(path)
    model.eval()
    labels, _ = mlm_labels()
    with flow.no_grad():
        out = model(*our_inputs(), lm_labels=flow.tensor(labels))
    logits = hf(**hf_inputs()).prediction_logits  # HF reports a loss only with both labels
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(labels).reshape(-1))
    assert set(out) == {"total_loss", "lm_loss", "prediction_scores", "seq_relationship_score"}
    assert abs(out["lm_loss"].item() - ref.item()) < 1e-5


@pytest.mark.parametrize("num_labels", [3, 1], ids=["classification", "regression"])
def test_sequence_classification_matches_hf(tmp_path, num_labels):
    hf = make_hf(tmp_path / "cls", "BertForSequenceClassification", num_labels=num_labels)
    model = BertForSequenceClassification.from_huggingface(str(tmp_path / "cls"))
    assert model.num_labels == num_labels
    labels = np.array([0, 2, 1]) if num_labels > 1 else np.array([0.5, -1.0, 2.0], np.float32)
    hf.train()
    ref = hf(**hf_inputs(), labels=torch.tensor(labels))
    model.train()
    out = model(*our_inputs(), labels=flow.tensor(labels))
    assert set(out) == {"loss"}
    assert abs(out["loss"].item() - ref.loss.item()) < 1e-5
    model.eval()
    with flow.no_grad():
        logits = model(*our_inputs())["prediction_scores"].numpy()
    hf.eval()
    ref_logits = hf(**hf_inputs()).logits.detach().numpy()
    assert maxabs(logits, ref_logits.reshape(logits.shape)) < 1e-4


def test_masked_lm_folder_loads_without_pooler_and_binary_head(tmp_path):
    """A BertForMaskedLM folder (no pooler, no next-sentence head) into BertForPreTraining: both
    switched off, the MLM logits HF's; a classifier from it gets a new pooler, as in HF."""
    hf = make_hf(tmp_path, "BertForMaskedLM")
    model = BertForPreTraining.from_huggingface(str(tmp_path)).eval()
    assert model.bert.pooler is None and model.cls_head.seq_relationship is None
    with flow.no_grad():
        out = model(*our_inputs())
    real = ATTENTION.astype(bool)
    assert maxabs(out["prediction_scores"].numpy()[real], hf(**hf_inputs()).logits.detach().numpy()[real]) < 1e-4
    clf = BertForSequenceClassification.from_huggingface(str(tmp_path), num_labels=2)
    assert clf.bert.pooler is not None
    ckpt = tmp_path / "ckpt"
    _run_tool("--from-hf", str(tmp_path), "--to", str(ckpt))
    cfg = json.loads((ckpt / "bert_config.json").read_text())
    assert cfg["add_pooling_layer"] is False and cfg["add_binary_head"] is False
    load_logical_state_dict(BertForPreTraining(**cfg), read_safetensors(str(ckpt / "model.safetensors")))


MULTI_HOT = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]], np.float32)


@pytest.mark.parametrize("problem_type, labels", [
    ("multi_label_classification", MULTI_HOT),
    ("regression", np.array([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5], [0.1, 0.2, 0.3]], np.float32)),
    (None, MULTI_HOT),  # float labels: HF infers multi-label, and so do we
], ids=["multi-label", "multi-output-regression", "inferred-multi-label"])
def test_every_hf_problem_type_trains_with_hf_loss(tmp_path, problem_type, labels):
    hf = make_hf(tmp_path, "BertForSequenceClassification", num_labels=3, problem_type=problem_type)
    model = BertForSequenceClassification.from_huggingface(str(tmp_path)).train()
    ref = hf.train()(**hf_inputs(), labels=torch.tensor(labels)).loss
    loss = model(*our_inputs(), labels=flow.tensor(labels))["loss"]
    assert abs(loss.item() - ref.item()) < 1e-5
    loss.backward()
    ref.backward()
    assert maxabs(model.classifier.weight.grad.numpy(), hf.classifier.weight.grad.numpy()) < 1e-5


def test_float_class_indices_are_refused_as_hf_refuses_them(tmp_path):
    """Float labels [b] with 3 classes: HF infers multi-label and fails on the shape; they were
    truncated to class indices here. Named as a single-label problem, float labels are refused."""
    make_hf(tmp_path, "BertForSequenceClassification", num_labels=3)
    model = BertForSequenceClassification.from_huggingface(str(tmp_path)).train()
    float_indices = flow.tensor(np.array([2.0, 1.0, 0.0], np.float32))
    with pytest.raises(ValueError, match=r"labels of shape \[3\] for logits of shape \[3, 3\]"):
        model(*our_inputs(), labels=float_indices)
    single = BertForSequenceClassification.from_huggingface(str(tmp_path), problem_type="single_label_classification")
    with pytest.raises(ValueError, match="takes integer class labels, got engine.float32 labels of shape \\[3\\]"):
        single.train()(*our_inputs(), labels=float_indices)


def test_classifier_from_a_pretrained_folder(hf_pretraining):
    """A pretrained BERT folder (no classifier) gives the encoder's weights and a new classifier."""
    path, hf = hf_pretraining
    model = BertForSequenceClassification.from_huggingface(path, num_labels=4)
    assert tuple(model.classifier.weight.shape) == (4, HF_BERT["hidden_size"])
    ref = hf.bert.pooler.dense.weight.detach().numpy()
    assert np.array_equal(model.bert.pooler.dense.weight.detach().numpy(), ref)


def test_another_number_of_labels_needs_ignore_mismatched_sizes(tmp_path):
    """As HF's from_pretrained: a folder classifying 3 labels loaded with num_labels=4 is an error
    naming both shapes, and with ignore_mismatched_sizes=True a new classifier (the encoder the
    folder's)."""
    hf = make_hf(tmp_path, "BertForSequenceClassification", num_labels=3)
    with pytest.raises(HFConfigError, match=r"classifier.weight is \[3, 64\], the model's \[4, 64\].*"
                                            "ignore_mismatched_sizes=True"):
        BertForSequenceClassification.from_huggingface(str(tmp_path), num_labels=4)
    model = BertForSequenceClassification.from_huggingface(str(tmp_path), num_labels=4, ignore_mismatched_sizes=True)
    assert tuple(model.classifier.weight.shape) == (4, 64)
    assert np.array_equal(model.bert.pooler.dense.weight.detach().numpy(), hf.bert.pooler.dense.weight.detach().numpy())


def test_bert_model_matches_hf_bert_model(hf_pretraining):
    path, hf = hf_pretraining
    model = BertModel.from_huggingface(path)  # the pretraining heads of the file are not used
    model.eval()
    with flow.no_grad():
        seq, pooled = model(*our_inputs())
    ref = hf.bert(**hf_inputs())
    real = ATTENTION.astype(bool)
    assert maxabs(seq.numpy()[real], ref.last_hidden_state.detach().numpy()[real]) < 1e-5
    assert maxabs(pooled.numpy(), ref.pooler_output.detach().numpy()) < 1e-5


def test_old_layernorm_names_and_unprefixed_files(hf_pretraining, tmp_path):
    """Checkpoints of the original release name LayerNorm parameters gamma/beta; BertModel files
    have no 'bert.' prefix."""
    from libai.models.utils import write_safetensors

    path, hf = hf_pretraining
    sd = read_safetensors(os.path.join(path, "model.safetensors"))
    renamed = {k[len("bert."):].replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                                       "LayerNorm.beta"): v
               for k, v in sd.items() if k.startswith("bert.")}
    d = tmp_path / "old"
    d.mkdir()
    (d / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    write_safetensors(renamed, str(d / "model.safetensors"))
    model = BertModel.from_huggingface(str(d))
    ref = BertModel.from_huggingface(path)
    a, b = logical_state_dict(model), logical_state_dict(ref)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _run_tool(*args):
    tool = os.path.join(ROOT, "tools", "convert_checkpoint.py")
    subprocess.run([sys.executable, tool, *args], check=True, env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.parametrize("cls_name", ["BertForPreTraining", "BertForSequenceClassification", "BertModel"])
def test_convert_checkpoint_round_trip(tmp_path, cls_name):
    import transformers

    src = tmp_path / "hf"
    hf = make_hf(src, cls_name)
    ckpt, back = tmp_path / "ckpt", tmp_path / "back"
    _run_tool("--from-hf", str(src), "--to", str(ckpt))
    _run_tool("--from-libai", str(ckpt), "--to-hf", str(back))
    a = read_safetensors(str(src / "model.safetensors"))
    b = read_safetensors(str(back / "model.safetensors"))
    b.pop("cls.predictions.decoder.bias", None)  # written for older readers; tied to cls.predictions.bias
    assert sorted(a) == sorted(b)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    hf2 = getattr(transformers, cls_name).from_pretrained(str(back)).eval()
    with torch.no_grad():
        out, out2 = hf(**hf_inputs()), hf2(**hf_inputs())
    first = next(iter(out.values()))
    assert maxabs(first, out2[next(iter(out2.keys()))]) == 0
    # the checkpoint loads into our model
    cfg = json.loads((ckpt / "bert_config.json").read_text())
    model = {"BertForPreTraining": lambda: BertForPreTraining(**cfg),
             "BertForSequenceClassification": lambda: BertForSequenceClassification(num_labels=2, **cfg),
             "BertModel": lambda: BertModel(**cfg)}[cls_name]()
    load_logical_state_dict(model, flow.load(str(ckpt / "model.safetensors")))


def test_convert_pre_ln_checkpoint_to_hf(hf_pretraining, tmp_path):
    """A pre-LN model with apply_residual_post_layernorm converts to an equal HF post-LN model;
    without it the converter refuses, naming the setting."""
    import transformers

    path, hf = hf_pretraining
    kw = dict(layernorm_position="pre", apply_residual_post_layernorm=True)
    model = BertForPreTraining.from_huggingface(path, **kw)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    flow.save(logical_state_dict(model), str(ckpt / "model.safetensors"))
    (ckpt / "bert_config.json").write_text(json.dumps(model.bert.config))
    _run_tool("--from-libai", str(ckpt), "--to-hf", str(tmp_path / "back"))
    hf2 = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "back")).eval()
    with torch.no_grad():
        assert maxabs(hf2(**hf_inputs()).prediction_logits, hf(**hf_inputs()).prediction_logits) < 1e-6
    with pytest.raises(HFConfigError, match="apply_residual_post_layernorm"):
        libai_to_hf_bert(logical_state_dict(model), {**model.bert.config, "apply_residual_post_layernorm": False})


@pytest.mark.parametrize("key,value", [("hidden_act", "relu"), ("position_embedding_type", "relative_key"),
                                       ("is_decoder", True), ("model_type", "roberta")])
def test_unsupported_config_key_is_named(hf_pretraining, tmp_path, key, value):
    path, _ = hf_pretraining
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg[key] = value
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    os.symlink(os.path.join(path, "model.safetensors"), d / "model.safetensors")
    with pytest.raises(HFConfigError, match=key):
        BertModel.from_huggingface(str(d))


def test_missing_heads_and_files_are_named(tmp_path):
    make_hf(tmp_path / "bare", "BertModel")
    with pytest.raises(HFConfigError, match="no pretraining heads"):
        BertForPreTraining.from_huggingface(str(tmp_path / "bare"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertModel.from_huggingface(str(tmp_path))


def test_config_errors_name_the_key():
    from libai.config import ConfigKeyError

    with pytest.raises(ConfigKeyError, match="hidden_layer"):
        BertForPreTraining(dict(vocab_size=100, hidden_size=64, hidden_layer=2, num_attention_heads=4))
    with pytest.raises(TypeError, match="add_binary_head"):  # a pretraining key: no effect on BertModel
        BertModel(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4, add_binary_head=False)
    with pytest.raises(ValueError, match="add_binary_head"):
        BertForSequenceClassification(dict(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4,
                                           add_binary_head=True))
    assert BertForPreTraining(dict(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4,
                                   add_binary_head=False)).cls_head.seq_relationship is None
    with pytest.raises(ValueError, match="layernorm_position"):
        BertModel(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4, layernorm_position="mid")
    with pytest.raises(NotImplementedError, match="amp_enabled"):
        BertModel(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4, amp_enabled=True)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        BertModel(vocab_size=100, hidden_size=64, hidden_layers=1, num_attention_heads=4,
                  max_position_embeddings=8)(flow.tensor(IDS))
