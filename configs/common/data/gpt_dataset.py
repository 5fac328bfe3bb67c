"""GPT-2 data config (LiBai's configs/common/data/gpt_dataset.py).

    tokenization.tokenizer                    GPT2Tokenizer(vocab_file, merges_file)
    tokenization.make_vocab_size_divisible_by the model's vocab is the tokenizer's size padded
                                              to a multiple of this * tensor_parallel_size
    dataloader.train                          build_nlp_train_val_test_loader over GPT2Dataset(s):
                                              documents split in order by `splits` into
                                              train / valid / test

Paths left at None (the default) mean the embedded default corpus: Python's own documentation
(`libai.data.corpus.default_gpt2_corpus()`: a BPE tokenizer trained on it and the tokenized
mmap dataset, built once on first use and cached under ~/.cache/libai/default_corpus). Set
`tokenization.tokenizer.vocab_file`, `tokenization.tokenizer.merges_file` and
`dataloader.train.dataset[0].data_prefix` to train on your own data (docs/gpt2.md).
`train_val_test_num_samples=None` is filled in by the trainer from train.train_iter, the global
batch size and the evaluation settings (as LiBai).
"""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import GPT2Dataset, build_nlp_train_val_test_loader
from libai.tokenizer import GPT2Tokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(GPT2Tokenizer)(
    vocab_file=None,   # None: the default corpus's vocab.json
    merges_file=None,  # None: the default corpus's merges.txt
)
tokenization.append_eod = True  # the default corpus's documents end with <|endoftext|>
tokenization.make_vocab_size_divisible_by = 128
# vocabulary size asked of the BPE trained on the default corpus (used only when paths are None)
tokenization.default_corpus_vocab_size = 8192

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(GPT2Dataset)(
            name="gpt-2",
            data_prefix=None,  # None: the default corpus
            seq_length=1024,
            seed=1234,
        ),
    ],
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    train_val_test_num_samples=None,  # filled in by the trainer (libai.data.train_val_test_num_samples)
    num_workers=0,
    _recursive_=False,
)
