"""A small MLP classifier following libai's model convention: in training `forward(images,
labels)` returns a dict of losses ({"loss": ...}); in eval it returns {"prediction_scores": ...}."""
import engine.nn as nn
import engine.nn.functional as F

from .utils.model_config import check_positive_sizes

__all__ = ["MLPClassifier"]


class MLPClassifier(nn.Module):
    def __init__(self, in_features=16, hidden_size=64, num_classes=4, num_layers=2, dropout=0.0):
        super().__init__()
        check_positive_sizes("MLPClassifier", in_features=in_features, hidden_size=hidden_size,
                             num_classes=num_classes, num_layers=num_layers)
        layers = []
        dim = in_features
        for _ in range(max(num_layers - 1, 0)):
            layers += [nn.Linear(dim, hidden_size), nn.GELU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            dim = hidden_size
        self.body = nn.Sequential(*layers) if layers else nn.Identity()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images, labels=None):
        scores = self.head(self.body(images))
        if self.training and labels is not None:
            return {"loss": F.cross_entropy(scores, labels)}
        return {"prediction_scores": scores}
