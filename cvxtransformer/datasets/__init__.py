"""Data sets, each a function of a seed with a documented shape."""
from .student_teacher import student_teacher

__all__ = ["student_teacher"]
