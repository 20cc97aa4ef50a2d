"""models: what is learned (features, cost model, analytic priors, threshold tables); the public
names are `__all__`, each imported from its submodule on first use (`_SUBMODULE_OF`)."""

import importlib

_SUBMODULE_OF = {
    **dict.fromkeys(('CostModel',), 'cost_model'),
    **dict.fromkeys(('TrainingSet', 'training_set'), 'dataset'),
    **dict.fromkeys(('FEATURE_NAMES', 'feature_matrix'), 'features'),
    **dict.fromkeys(('fit_and_build',), 'fit'),
    **dict.fromkeys(('CardSpec', 'DeviceIdentity', 'spec_for'), 'identity'),
    **dict.fromkeys(('ClassKey', 'MeasuredEntry', 'bucket_of', 'class_key', 'entry_key', 'length_bucket'), 'measured'),
    **dict.fromkeys(('Measurement',), 'measurement'),
    **dict.fromkeys(('card_scale', 'merge_tables'), 'merge'),
    **dict.fromkeys(('home', 'journals_dir', 'tables_dir'), 'paths'),
    **dict.fromkeys(('PriorRanker', 'Ranker', 'prior_seconds', 'roofline_seconds'), 'priors'),
    **dict.fromkeys(('ChoiceQuality', 'Guard', 'Quality', 'holdout_quality'), 'quality'),
    **dict.fromkeys(('TableLookup', 'TableWarning', 'export_table', 'import_table', 'local_table_path',
                     'lookup_table', 'store_table'), 'sharing'),
    **dict.fromkeys(('ThresholdTable',), 'table'),
    **dict.fromkeys(('build_table',), 'table_build'),
    **dict.fromkeys(('load_table', 'loads_table', 'save_table'), 'table_io'),
    **dict.fromkeys(('TableError',), 'table_schema'),
}
"""Public name -> its submodule, imported on first use (PEP 562): scikit-learn takes ~2 s to import."""


def __getattr__(name: str):
    submodule = _SUBMODULE_OF.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted((*globals(), *_SUBMODULE_OF))


__all__ = list(_SUBMODULE_OF)
