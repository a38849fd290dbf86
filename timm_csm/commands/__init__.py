"""The command lines of the method's steps, installed as console scripts with the package.

- ``timm-csm-train`` (:mod:`.train`, the library's :func:`timm_csm.training.run`): train a classifier and evaluate
  its calibration; also ``accelerate launch -m timm_csm.commands.train``.
- ``timm-csm-pipeline`` (:mod:`.pipeline`, the library's :func:`timm_csm.recipes.run_recipe`): the main job, by
  profile (``demo``, ``smoke``, ``full``).
- ``timm-csm-train-generator`` (:mod:`.train_generator`): train a class-conditional diffusers generator.
- ``timm-csm-generate`` (:mod:`.generate`): generate semantic-mixing groups with a generator.
- ``timm-csm-annotate`` (:mod:`.annotate`): re-annotate generated groups into a CSM dataset.
- ``timm-csm-publish`` (:mod:`.publish`): push a CSM dataset to the Hugging Face Hub.
- ``timm-csm-evaluate-generator`` (:mod:`.evaluate_generator`): the annotation's generator check on a few groups,
  before any generation: its verdict.
- ``timm-csm-calibrate`` (:mod:`.calibrate`, the library's :func:`timm_csm.evaluation.calibrate`): fit post-hoc calibrators to a model you already have and
  report before / after.
- ``timm-csm-install-metrics`` (:mod:`.install_metrics`): make ``evaluate.load(name)`` find the metrics.
- ``timm-csm-compare`` (:mod:`.compare`): paired differences between methods run at matching seeds, with
  t-intervals and Holm-corrected decisions.
- ``timm-csm-study`` (:mod:`.study`, the library's :mod:`timm_csm.study`): a pre-registered calibration study from
  its spec file: ``init`` writes one and states its power, ``plan`` lists its cells.

Each module here is argparse plus library calls: ``build_parser()`` and ``main(argv=None)``, a
:func:`timm_csm.cli.console_command` (exit status 0 on success, one-line errors). ``python -m
timm_csm.commands.<name>`` and, in a source checkout, ``python hub_scripts/<name>.py`` run the same ``main``.
"""
