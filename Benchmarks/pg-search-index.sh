#!/usr/bin/env bash
# Migration 13's case, inside PostgreSQL alone: the same UPDATE of a thread
# row (updated_at, model, version, and name and preview to themselves, as the
# store writes every column) on 16 of 10,000 rows, 20,000 times with a
# commit each, in three layouts: the search text's trigram index in the row
# (before migration 13), no search index, and the text in a table of its own
# kept by a trigger when it changes (migration 13). Prints µs per update.
# Usage: PREVIEW=120 Benchmarks/pg-search-index.sh   (the preview's length)
set -euo pipefail
. "$(cd "$(dirname "$0")" && pwd)/pg-cluster.sh"
psql() { "$pgbin/psql" -h 127.0.0.1 -p "$pgport" -U threadwire -d tw -q -X "$@"; }
psql -c "CREATE EXTENSION IF NOT EXISTS pg_trgm" 
psql -v preview="${PREVIEW:-200}" <<'SQL'
CREATE TABLE threads (id text PRIMARY KEY, owner text NOT NULL, session_id text NOT NULL, parent_id text, archived boolean NOT NULL,
  created_at bigint NOT NULL, updated_at bigint NOT NULL, name text, preview text NOT NULL, model text, version bigint NOT NULL);
CREATE INDEX threads_created ON threads (archived, created_at, id);
CREATE INDEX threads_updated ON threads (archived, updated_at, id);
CREATE INDEX threads_owner_created ON threads (owner, archived, created_at, id);
CREATE INDEX threads_owner_updated ON threads (owner, archived, updated_at, id);
CREATE INDEX threads_parent ON threads (parent_id);
CREATE INDEX threads_session ON threads (session_id) WHERE parent_id IS NOT NULL;
CREATE INDEX threads_session_all ON threads (session_id);
CREATE INDEX threads_search ON threads USING gin ((coalesce(name, '') || E'\n' || preview) gin_trgm_ops);
INSERT INTO threads SELECT 't' || g, 'default', 's' || g, NULL, false, g, g, NULL,
  left(repeat('Refactor the parser so that error messages name the line and column of the token; ', 3), :preview), 'm', 1
  FROM generate_series(1, 10000) g;
VACUUM ANALYZE threads;
CREATE PROCEDURE churn(n int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..n LOOP
    UPDATE threads SET updated_at = 100000 + i, name = name, preview = preview, model = 'm' || i, version = version + 1 WHERE id = 't' || (1 + i % 16);
    COMMIT;
  END LOOP;
END $$;
SQL
psql -v preview="${PREVIEW:-200}" <<'SQL'
CREATE TABLE thread_search (thread_id text PRIMARY KEY REFERENCES threads (id) ON DELETE CASCADE, doc text NOT NULL);
INSERT INTO thread_search SELECT id, coalesce(name, '') || E'\n' || preview FROM threads;
CREATE FUNCTION thread_search_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO thread_search (thread_id, doc) VALUES (NEW.id, coalesce(NEW.name, '') || E'\n' || NEW.preview)
    ON CONFLICT (thread_id) DO UPDATE SET doc = excluded.doc;
  RETURN NULL;
END $$;
SQL
for round in 1 2 3; do
  for variant in in-row none table; do
    psql -c "DROP INDEX IF EXISTS threads_search" -c "DROP INDEX IF EXISTS thread_search_doc" -c "DROP TRIGGER IF EXISTS thread_search_update ON threads"
    if [ $variant = in-row ]; then
      psql -c "CREATE INDEX threads_search ON threads USING gin ((coalesce(name, '') || E'\n' || preview) gin_trgm_ops)"
    elif [ $variant = table ]; then
      psql -c "CREATE INDEX thread_search_doc ON thread_search USING gin (doc gin_trgm_ops)" \
           -c "CREATE TRIGGER thread_search_update AFTER UPDATE OF name, preview ON threads FOR EACH ROW WHEN (OLD.name IS DISTINCT FROM NEW.name OR OLD.preview IS DISTINCT FROM NEW.preview) EXECUTE FUNCTION thread_search_keep()"
    fi
    psql -c "VACUUM threads" 
    start=$(date +%s.%N)
    psql -c "SET synchronous_commit = off" -c "CALL churn(20000)"
    end=$(date +%s.%N)
    echo "round $round, search text $variant: $(python3 -c "print(f'{($end-$start)/20000*1e6:.1f}')") µs per update"
  done
done
