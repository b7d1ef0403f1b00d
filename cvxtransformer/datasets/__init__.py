"""Data sets, each a function of a seed with a documented shape.

* :func:`student_teacher`: Gaussian tokens, targets of a random teacher attention network;
* :func:`modular_division`, :func:`periodicity`: algorithmic tasks of the grokking
  literature as token sequences, with one shuffled train/test split;
* :func:`bert_student_teacher`, :func:`save_bert_student_teacher`: activations around one
  layer of a Hugging Face BERT model (optional extra ``transformers``).
"""
from .algorithmic import AlgorithmicData, modular_division, periodicity
from .bert import bert_student_teacher, save_bert_student_teacher
from .student_teacher import student_teacher

__all__ = ["AlgorithmicData", "bert_student_teacher", "modular_division", "periodicity",
           "save_bert_student_teacher", "student_teacher"]
