"""BERT data config (LiBai's configs/common/data/bert_dataset.py).

    tokenization.tokenizer                    BertTokenizer(vocab_file) (WordPiece)
    tokenization.make_vocab_size_divisible_by the model's vocab is the tokenizer's size padded
                                              to a multiple of this * tensor_parallel_size
    dataloader.train                          build_nlp_train_val_test_loader over BertDataset(s):
                                              documents split in order by `splits` into
                                              train / valid / test

The data is sentence-level (`tools/preprocess_data.py --split-sentences`, PREFIX_text_sentence).
Paths left at None (the default) mean the embedded default corpus: Python's own documentation
(`libai.data.corpus.default_bert_corpus()`: a WordPiece vocabulary trained on it and the
sentence-split mmap dataset, built once on first use and cached under ~/.cache/libai). Set
`tokenization.tokenizer.vocab_file` and `dataloader.train.dataset[0].data_prefix` to train on your
own data (docs/bert.md). BertDataset's tokenizer is the one the trainer builds from
`tokenization` (libai.tokenizer.get_tokenizer()). `train_val_test_num_samples=None` is filled in
by the trainer from train.train_iter, the global batch size and the evaluation settings.
"""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import BertDataset, build_nlp_train_val_test_loader
from libai.tokenizer import BertTokenizer

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(BertTokenizer)(
    vocab_file=None,  # None: the default corpus's vocab.txt
    do_lower_case=True,
)
tokenization.make_vocab_size_divisible_by = 128
# vocabulary size asked of the WordPiece trained on the default corpus (used only when paths are None)
tokenization.default_corpus_vocab_size = 8192

dataloader = OmegaConf.create()
dataloader.train = LazyCall(build_nlp_train_val_test_loader)(
    dataset=[
        LazyCall(BertDataset)(
            name="bert",
            data_prefix=None,  # None: the default corpus
            max_seq_length=512,
            mask_lm_prob=0.15,
            short_seq_prob=0.1,
            binary_head=True,
            binary_head_task="sop",
            whole_word_masking=False,
            seed=1234,
        ),
    ],
    splits=[[949.0, 50.0, 1.0]],
    weights=[1.0],
    train_val_test_num_samples=None,  # filled in by the trainer (libai.data.train_val_test_num_samples)
    num_workers=0,
    _recursive_=False,
)
