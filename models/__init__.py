"""models: what is learned (Problem features, cost model, analytic priors, threshold tables).

Public API
----------
Identity and paths: `DeviceIdentity`, `home`, `tables_dir`, `models_dir`, `journals_dir`.
Priors: `CardSpec`, `spec_for`, `prior_seconds`, `roofline_seconds`, `PriorRanker`, `Ranker`.
Learning: `feature_matrix`, `FEATURE_NAMES`, `CostModel`, `training_set`, `holdout_quality`,
`Quality`, `ChoiceQuality`, `save_model`, `load_model`, `ModelVersionError`, `fit_and_build`.
Tables: `ThresholdTable` (a ranker: measured entries, then the embedded cost model or its decision
map as its quality guard allows), `build_table`, `TableError`, `load_table`, `loads_table`,
`save_table`, `class_key`, `bucket_of`, `MeasuredEntry`, `entry_key`, `Guard`.
Sharing: `export_table`, `import_table`, `store_table`, `merge_tables`, `lookup_table`,
`TableLookup`, `TableWarning`.
"""

from attn_dispatch.models.buckets import ClassKey, bucket_of, class_key, length_bucket
from attn_dispatch.models.cards import CardSpec, spec_for
from attn_dispatch.models.cost_model import CostModel
from attn_dispatch.models.dataset import TrainingSet, training_set
from attn_dispatch.models.features import FEATURE_NAMES, feature_matrix
from attn_dispatch.models.fit import fit_and_build
from attn_dispatch.models.guard import Guard
from attn_dispatch.models.identity import DeviceIdentity
from attn_dispatch.models.measured import MeasuredEntry, entry_key
from attn_dispatch.models.measurement import Measurement
from attn_dispatch.models.merge import card_scale, merge_tables
from attn_dispatch.models.paths import home, journals_dir, models_dir, tables_dir
from attn_dispatch.models.persist import ModelVersionError, load_model, save_model
from attn_dispatch.models.priors import PriorRanker, prior_seconds, roofline_seconds
from attn_dispatch.models.quality import ChoiceQuality, Quality, holdout_quality
from attn_dispatch.models.ranking import Ranker
from attn_dispatch.models.sharing import (
    TableLookup,
    TableWarning,
    export_table,
    import_table,
    local_table_path,
    lookup_table,
    store_table,
)
from attn_dispatch.models.table import ThresholdTable
from attn_dispatch.models.table_build import build_table
from attn_dispatch.models.table_io import load_table, loads_table, save_table
from attn_dispatch.models.table_schema import TableError

__all__ = [
    "ClassKey", "bucket_of", "class_key", "length_bucket", "CardSpec", "spec_for", "CostModel",
    "TrainingSet", "training_set", "FEATURE_NAMES", "feature_matrix", "fit_and_build", "DeviceIdentity",
    "Measurement", "card_scale", "merge_tables", "home", "journals_dir", "models_dir", "tables_dir",
    "ModelVersionError", "load_model", "save_model", "PriorRanker", "prior_seconds", "roofline_seconds",
    "ChoiceQuality", "Quality", "holdout_quality", "Ranker", "TableLookup", "TableWarning", "export_table",
    "import_table", "local_table_path", "lookup_table", "store_table", "ThresholdTable", "build_table", "load_table",
    "loads_table", "save_table", "TableError", "Guard", "MeasuredEntry", "entry_key",
]
