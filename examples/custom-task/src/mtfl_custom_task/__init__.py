"""mtfl-custom-task: an mtfl-lab plug-in package (docs/extending.md, "A worked example").

* :mod:`mtfl_custom_task.models` — ``tabular_mlp`` and ``tabular_mlp_wide`` (group ``mtfl.models``): a residual
  MLP for feature vectors, built by :func:`~mtfl_custom_task.models.build_tabular_mlp`.
* :mod:`mtfl_custom_task.make_data` — ``python -m mtfl_custom_task.make_data OUT.npz`` writes a
  tabular classification set for mtfl-lab's built-in ``npz`` data set.
* :mod:`mtfl_custom_task.strategy` — ``flops_share`` (group ``mtfl.strategies``): each task's
  share of its device in proportion to its training FLOPs per sample.

Importing the package imports neither torch nor the control plane: an agent loads the model's
entry point without the control plane installed, and the web process lists it without torch.
"""

__version__ = "0.1.0"
