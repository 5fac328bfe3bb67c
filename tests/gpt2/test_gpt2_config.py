"""GPTModel.from_config: the defaults are GPTModel.__init__'s (written once); only the keys of the
config are passed; unknown keys are an error naming them."""
import inspect

import pytest
from omegaconf import OmegaConf

from libai.config import ConfigKeyError, get_config
from libai.models import GPTForPreTraining, GPTModel

SMALL = dict(hidden_layers=1, vocab_size=16, hidden_size=8, num_attention_heads=2)


def test_from_config_passes_only_the_given_keys_and_init_supplies_the_defaults():
    assert GPTModel.from_config(OmegaConf.create(SMALL)) == SMALL
    model = GPTModel(OmegaConf.create(SMALL))
    defaults = {k: p.default for k, p in inspect.signature(GPTModel.__init__).parameters.items()}
    assert model.config["max_seq_length"] == defaults["max_seq_length"] == 1024
    assert model.config["layernorm_epsilon"] == defaults["layernorm_epsilon"]
    assert model.config["ffn_hidden_size"] == 4 * SMALL["hidden_size"]


def test_the_shipped_model_config_has_only_known_keys():
    cfg = get_config("common/models/gpt.py").model.cfg
    assert GPTModel.from_config(cfg) == OmegaConf.to_container(cfg)


@pytest.mark.parametrize("typo,suggested", [("max_seq_len", "max_seq_length"),
                                            ("hidden_dropout_prob", "output_dropout_prob")])
def test_an_unknown_model_key_is_an_error_naming_it(typo, suggested):
    cfg = OmegaConf.create({**SMALL, typo: 0.1})
    with pytest.raises(ConfigKeyError) as info:
        GPTForPreTraining(cfg)
    msg = str(info.value)
    assert f"'model.cfg.{typo}'" in msg and f"'model.cfg.{suggested}'" in msg


def test_a_missing_required_key_is_an_error_naming_it():
    cfg = {k: v for k, v in SMALL.items() if k != "hidden_size"}
    with pytest.raises(ConfigKeyError, match="missing.*hidden_size"):
        GPTModel.from_config(cfg)


def test_amp_enabled_is_refused_not_ignored():
    with pytest.raises(NotImplementedError, match="amp_enabled"):
        GPTModel(OmegaConf.create({**SMALL, "amp_enabled": True}))
