"""`task_dataloader`: the train loader and one test loader per dev split of a GLUE / CLUE task,
as config nodes (imported by the task configs)."""
from omegaconf import OmegaConf

from libai.config import LazyCall
from libai.data import build_nlp_test_loader, build_nlp_train_loader
from projects.text_classification.dataset import build_clue_dataset, build_glue_dataset, get_clue_task, get_glue_task

# the model's position table, given to each dataset so that a longer task.max_seq_length fails when
# the datasets are built, naming both keys (null with model.cfg=null: a HuggingFace folder's model)
MODEL_POSITIONS = "${oc.select:model.cfg.max_position_embeddings,null}"


def task_dataloader(benchmark, task, data_dir, max_seq_length=128):
    """`benchmark` "glue" (data_dir/train.tsv, dev.tsv or MNLI's dev_matched.tsv and
    dev_mismatched.tsv) or "clue" (data_dir/train.json, dev.json). The tokenizer is the run's."""
    build, spec = {"glue": (build_glue_dataset, get_glue_task), "clue": (build_clue_dataset, get_clue_task)}[benchmark]
    dev_splits = spec(task).dev_splits

    def dataset(split):
        return LazyCall(build)(task=task, data_dir=data_dir, split=split, max_seq_length=max_seq_length,
                               max_position_embeddings=MODEL_POSITIONS)

    loaders = OmegaConf.create()
    loaders.train = LazyCall(build_nlp_train_loader)(dataset=[dataset("train")])
    loaders.test = [LazyCall(build_nlp_test_loader)(dataset=dataset(split)) for split in dev_splits]
    return loaders
