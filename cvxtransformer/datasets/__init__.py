"""Data sets, each a function of a seed with a documented shape.

* :func:`student_teacher`: Gaussian tokens, targets of a random teacher attention network;
* :func:`modular_division`, :func:`periodicity`: algorithmic tasks of the grokking
  literature as token sequences, with one shuffled train/test split;
* :func:`bert_data`, :func:`save_bert_data`: train, validation and test activations of one layer
  of a pretrained BERT-family model (all-MiniLM-L6-v2 by default, :func:`minilm_path`) on real
  English text; :func:`bert_student_teacher`, :func:`save_bert_student_teacher`: the same on
  sentence pairs (optional extra ``transformers``).
"""
from .algorithmic import AlgorithmicData, modular_division, periodicity
from .bert import bert_data, bert_student_teacher, save_bert_data, save_bert_student_teacher
from .pretrained import minilm_path
from .student_teacher import student_teacher

__all__ = ["AlgorithmicData", "bert_data", "bert_student_teacher", "minilm_path", "modular_division", "periodicity",
           "save_bert_data", "save_bert_student_teacher", "student_teacher"]
