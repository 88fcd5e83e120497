CREATE TABLE al_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);
CREATE TABLE al_namespaces (
	name VARCHAR(255) NOT NULL, 
	properties TEXT NOT NULL, 
	created_at BIGINT NOT NULL, 
	PRIMARY KEY (name)
);
CREATE TABLE al_tables (
	table_id INTEGER NOT NULL, 
	namespace VARCHAR(255) NOT NULL, 
	name VARCHAR(255) NOT NULL, 
	location TEXT NOT NULL, 
	current_schema_id INTEGER NOT NULL, 
	current_snapshot_id BIGINT, 
	last_snapshot_id BIGINT NOT NULL, 
	last_field_id INTEGER NOT NULL, 
	partition_by TEXT NOT NULL, 
	primary_key TEXT NOT NULL, 
	buckets INTEGER, 
	properties TEXT NOT NULL, 
	created_at BIGINT NOT NULL, 
	PRIMARY KEY (table_id), 
	CONSTRAINT al_tables_name UNIQUE (namespace, name)
);
CREATE TABLE al_schemas (
	table_id INTEGER NOT NULL, 
	schema_id INTEGER NOT NULL, 
	arrow_schema BLOB NOT NULL, 
	created_at BIGINT NOT NULL, 
	PRIMARY KEY (table_id, schema_id), 
	FOREIGN KEY(table_id) REFERENCES al_tables (table_id) ON DELETE CASCADE
);
CREATE TABLE al_snapshots (
	table_id INTEGER NOT NULL, 
	snapshot_id BIGINT NOT NULL, 
	parent_id BIGINT, 
	kind VARCHAR(32) NOT NULL, 
	committed_at BIGINT NOT NULL, 
	schema_id INTEGER NOT NULL, 
	commit_id VARCHAR(255), 
	added_files BIGINT NOT NULL, 
	removed_files BIGINT NOT NULL, 
	added_rows BIGINT NOT NULL, 
	removed_rows BIGINT NOT NULL, 
	total_files BIGINT NOT NULL, 
	total_rows BIGINT NOT NULL, 
	summary TEXT NOT NULL, 
	PRIMARY KEY (table_id, snapshot_id), 
	FOREIGN KEY(table_id) REFERENCES al_tables (table_id) ON DELETE CASCADE
);
CREATE INDEX al_snapshots_commit ON al_snapshots (table_id, commit_id);
CREATE TABLE al_partitions (
	partition_id INTEGER NOT NULL, 
	table_id INTEGER NOT NULL, 
	path TEXT NOT NULL, 
	partition_values TEXT NOT NULL, 
	PRIMARY KEY (partition_id), 
	CONSTRAINT al_partitions_path UNIQUE (table_id, path), 
	FOREIGN KEY(table_id) REFERENCES al_tables (table_id) ON DELETE CASCADE
);
CREATE TABLE al_files (
	file_id INTEGER NOT NULL, 
	table_id INTEGER NOT NULL, 
	path TEXT NOT NULL, 
	partition_id INTEGER, 
	bucket INTEGER, 
	added_snapshot BIGINT NOT NULL, 
	removed_snapshot BIGINT, 
	schema_id INTEGER NOT NULL, 
	row_count BIGINT NOT NULL, 
	file_size BIGINT NOT NULL, 
	content VARCHAR(16) NOT NULL, 
	stats TEXT NOT NULL, 
	key_min TEXT, 
	key_max TEXT, 
	seq_min BIGINT, 
	seq_max BIGINT, 
	PRIMARY KEY (file_id), 
	FOREIGN KEY(table_id) REFERENCES al_tables (table_id) ON DELETE CASCADE
);
CREATE INDEX al_files_added ON al_files (table_id, added_snapshot);
CREATE INDEX al_files_removed ON al_files (table_id, removed_snapshot);
CREATE TABLE al_tags (
	table_id INTEGER NOT NULL, 
	name VARCHAR(255) NOT NULL, 
	snapshot_id BIGINT NOT NULL, 
	created_at BIGINT NOT NULL, 
	PRIMARY KEY (table_id, name), 
	FOREIGN KEY(table_id) REFERENCES al_tables (table_id) ON DELETE CASCADE
);
