"""Recipe: pretrain a small BERT (4 layers, hidden 256, 4 heads, 128 tokens) on CPU.

    python tools/train_net.py --config-file configs/bert_pretrain.py [key=value ...]

With no data configured it trains on the embedded default corpus (Python's documentation, split
into sentences, with a WordPiece vocabulary trained on it; built once and cached, nothing
downloaded) in a few minutes on a laptop CPU. The losses are masked-LM (lm_loss) and
sentence-order prediction (sop_loss, with its accuracy sop_acc); MLMEvaluator reports masked-LM
accuracy and perplexity and SOP accuracy on the valid split (MLM_Acc, MLM_PPL, SOP_Acc; a test
split's, when the corpus has one, are test/MLM_Acc, ...). Logs, metrics.json, TensorBoard
events and checkpoints land in output/bert_pretrain/; model_final then fine-tunes in
projects/text_classification.

Your own corpus, bigger models and dp/tp layouts: docs/bert.md. E.g. 4 processes, 2-way data x
2-way tensor parallel:

    python -m engine.distributed.launch --nproc-per-node 4 tools/train_net.py \
        --config-file configs/bert_pretrain.py \
        train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2
"""
from libai.config import LazyCall, get_config
from libai.evaluation import MLMEvaluator

model = get_config("common/models/bert.py").model
_data = get_config("common/data/bert_dataset.py")
tokenization, dataloader = _data.tokenization, _data.dataloader
optim = get_config("common/optim.py").optim
train = get_config("common/train.py").train

# ---- model: vocab_size is replaced by the tokenizer's padded size when training starts
model.cfg.update(
    hidden_layers=4,
    hidden_size=256,
    intermediate_size=1024,
    num_attention_heads=4,
    max_position_embeddings=128,
)

# ---- data: default corpus (paths None); each sample is at most max_position_embeddings tokens
for _ds in dataloader.train.dataset:  # '_': not a config key
    _ds.max_seq_length = "${model.cfg.max_position_embeddings}"
dataloader.train.splits = [[949.0, 50.0, 1.0]]

optim.lr = 5e-4
optim.weight_decay = 0.01

train.update(
    output_dir="./output/bert_pretrain",
    train_micro_batch_size=16,
    global_batch_size=None,
    num_accumulation_steps=None,
    test_micro_batch_size=16,
    train_iter=300,
    warmup_ratio=0.05,
    log_period=10,
    input_placement_device="cpu",
    seed=1234,
)
train.checkpointer.update(period=100, max_to_keep=2)
train.evaluation.update(
    enabled=True,
    evaluator=LazyCall(MLMEvaluator)(),
    eval_period=100,
    eval_iter=10,
    eval_metric="MLM_Acc",  # the valid split's masked-LM accuracy (the test split's is "test/MLM_Acc")
    eval_mode="max",
)
