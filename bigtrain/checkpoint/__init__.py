"""Checkpoints: what a run saves, how it resumes, and the trained model as a HuggingFace folder.

layout (names, completeness, atomic publish, pruning) <- state (what one rank saves) <- saver (during the run) /
loader (resume, any plan or world size) / export (checkpoint -> HF folder, one process) ; run_dir decides whether a
start resumes, begins anew or refuses, before the process group exists.
"""
