"""The project's model: BERT with a classification (or regression) head, from one of two sources.

* Our pretraining: `build_classifier(cfg=bert cfg, num_labels=...)` builds the model from
  BertModel's keys; `train.load_weight=output/bert_pretrain/model_final` then fills the encoder
  (the checkpoint's `bert.*`; its pretraining heads are not used and the classifier starts fresh,
  both reported in the log).
* HuggingFace: `build_classifier(hf_path=folder, num_labels=...)` reads a BERT folder
  (config.json + model.safetensors; a pretrained BERT or an already fine-tuned
  BertForSequenceClassification). The config's vocabulary, sizes and dropout are the folder's.
"""
from libai.models import BertForSequenceClassification

__all__ = ["build_classifier"]


def build_classifier(cfg=None, num_labels=2, hf_path=None, classifier_dropout=None):
    """BertForSequenceClassification with `num_labels` outputs (1: regression); see the module
    docstring for `cfg` and `hf_path` (exactly one of them)."""
    if (cfg is None) == (hf_path is None):
        raise ValueError("build_classifier: give exactly one of cfg (BertModel's keys; weights from "
                         "train.load_weight) and hf_path (a HuggingFace BERT folder)")
    if hf_path is not None:
        extra = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
        return BertForSequenceClassification.from_huggingface(hf_path, num_labels=num_labels, **extra)
    return BertForSequenceClassification(cfg, num_labels=num_labels, classifier_dropout=classifier_dropout)
