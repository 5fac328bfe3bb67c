"""libai models on libai.layers: GPT-2 (`gpt_model`), BERT (`bert_model`), the Vision Transformer
(`vision_transformer`), the Swin Transformer (`swin_transformer`), and `mlp_classifier`, a small
model for the trainer's tests and examples."""
from .bert_model import BertForPreTraining, BertForSequenceClassification, BertModel  # noqa: E402
from .gpt_model import GPTForPreTraining, GPTLoss, GPTModel  # noqa: E402
from .swin_transformer import SwinTransformer  # noqa: E402
from .vision_transformer import SoftTargetCrossEntropy, VisionTransformer  # noqa: E402

__all__ = ["GPTModel", "GPTForPreTraining", "GPTLoss", "BertModel", "BertForPreTraining",
           "BertForSequenceClassification", "VisionTransformer", "SoftTargetCrossEntropy",
           "SwinTransformer"]
