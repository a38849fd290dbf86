"""Studies: a pre-registered comparison of calibration methods, from its spec to its decision.

* :mod:`.spec`: the spec file (TOML) as a typed, frozen tree (:class:`~.spec.StudySpec`), validated on load, each
  table read by :class:`~.spec_table.SpecTable`;
* :mod:`.amendments`: dated amendments appended to a spec, its digest, and whether a file is still the spec its
  first cell ran under;
* :mod:`.methods`: the methods a study compares, their tuning axes and the names of their configurations and cells;
* :mod:`.choose`: stage 1, every choice on the validation split alone;
* :mod:`.decide`: stage 2, the primary comparisons and Holm's decision;
* :mod:`.plan`: the cells a spec runs, stage by stage; :mod:`.cells`: its finished cells, read from their folders;
* :mod:`.template`: the spec ``timm-csm-study init`` writes, amendment 2's design;
* :mod:`.later_stages`: the stages after the decision (label variants, volume, other real subsets);
* :mod:`.report`: the study's page from its cells (``timm-csm-study report``), with :mod:`.report_spec` (the spec's
  ``[report]`` table), :mod:`.report_tables`, :mod:`.report_stages`, :mod:`.report_cost` and :mod:`.report_figures`.
* :mod:`.options`: each cell's training options, from the spec's recipe and the cell's method;
* :mod:`.engine`: :func:`~.engine.run_study`, the spec run stage by stage (``timm-csm-study run``), resumable, its
  cells run by one of :mod:`.executors` (local worker processes; Ray tasks); imported on use (torch, the recipes).
* :mod:`.settings`: the ``matched`` setting built from the cells' own training images (generator, generation,
  annotation), which the engine builds where no set is given; the spec's ``[settings]`` table in
  :mod:`.settings_spec`.
"""
from .amendments import SpecStatus, spec_digest, spec_status
from .choose import coordinate_search, stage1_choices
from .decide import Comparison, Decision, comparison_pairs
from .plan import PlannedCell, plan_cells
from .spec import StudySpec, load_spec, parse_spec

# ``choose`` and ``decide`` are modules here (their functions of the same name: ``study.choose.choose``,
# ``study.decide.decide``)
__all__ = ["StudySpec", "load_spec", "parse_spec", "SpecStatus", "spec_digest", "spec_status", "coordinate_search",
           "stage1_choices", "Comparison", "Decision", "comparison_pairs", "PlannedCell", "plan_cells"]
