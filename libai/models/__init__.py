"""libai models on libai.layers: GPT-2 (`gpt_model`), BERT (`bert_model`), the Vision Transformer
(`vision_transformer`), the Swin Transformer (`swin_transformer`), and `mlp_classifier`, a small
model for the trainer's tests and examples."""
from libai.utils.libai_names import missing_names_getattr

from .bert_model import BertForPreTraining, BertForSequenceClassification, BertModel  # noqa: E402
from .build import build_graph, build_model  # noqa: E402
from .gpt_model import GPTForPreTraining, GPTLoss, GPTModel  # noqa: E402
from .swin_transformer import SwinTransformer  # noqa: E402
from .vision_transformer import SoftTargetCrossEntropy, VisionTransformer  # noqa: E402

__all__ = ["build_model", "build_graph", "GPTModel", "GPTForPreTraining", "GPTLoss", "BertModel", "BertForPreTraining",
           "BertForSequenceClassification", "VisionTransformer", "SoftTargetCrossEntropy",
           "SwinTransformer"]

_MODELS_HERE = "this project has GPT-2, BERT, ViT and Swin (docs/migrating.md)"
__getattr__ = missing_names_getattr(__name__, {
    "RobertaModel": _MODELS_HERE, "RobertaForPreTraining": _MODELS_HERE, "RobertaForCausalLM": _MODELS_HERE,
    "T5Model": _MODELS_HERE, "T5ForPreTraining": _MODELS_HERE, "SwinTransformerV2": _MODELS_HERE,
    "ResMLP": _MODELS_HERE,
    "BertForClassification": "this project's BERT classifier is BertForSequenceClassification",
})

