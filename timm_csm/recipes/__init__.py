"""Recipes: the main job (generator -> semantic mixing -> re-annotation -> CE vs CSM -> report) as data and stages.

* :mod:`.profiles`: the registered profiles (``demo``, ``noaug``, ``smoke``, ``full``): :func:`get_profile`,
  :func:`list_profiles`, and :func:`rehearsal_profile` (a profile at toy size);
* :mod:`.cache`: folders keyed by a configuration (:class:`KeyedFolder`) and the stage cache on them
  (``<output>/<stage>-<key>/``, a ``DONE.json`` marker written last);
* :mod:`.derive`: CSM datasets derived from one (other labels, fewer groups, real copies), each written once;
* :mod:`.cells`: the cells of a benchmark table, keyed by their training options, resumed, recorded, verified;
* :mod:`.steps`: the method's steps, one function each (train a generator, generate, judge a generator, annotate),
  called by the commands and by the stages;
* :mod:`.stages`: one function per stage;
* :mod:`.report`: ``report.md`` and its figures;
* :mod:`.run`: :func:`run_recipe`, every stage of a profile (its command line: ``timm-csm-pipeline``,
  :mod:`timm_csm.commands.pipeline`).
"""
from .cache import KeyedFolder, Stage, StageCache, stage_key
from .profiles import (RecipeProfile, get_profile, list_profiles, paper_protocol, register_profile, rehearsal_profile,
                       resolve_dataset, training_options)
from .report import save_group_figure, write_report
from .run import run_recipe

__all__ = ["RecipeProfile", "register_profile", "get_profile", "list_profiles", "rehearsal_profile", "resolve_dataset",
           "training_options", "paper_protocol", "KeyedFolder", "Stage",
           "StageCache", "stage_key", "run_recipe", "write_report", "save_group_figure"]
