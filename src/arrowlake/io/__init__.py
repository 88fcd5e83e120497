"""Storage backends and Parquet file writing/reading with statistics.

Importing the package registers the storage backends that ship with arrowlake (object stores,
:mod:`arrowlake.io.object_store`) with the storage contract (:mod:`arrowlake.io.storage`).
"""

from arrowlake.io import object_store as object_store
