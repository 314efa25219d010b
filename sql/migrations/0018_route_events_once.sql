-- A worker redelivers a batch of route events whose ReportRoutes call it
-- could not confirm (the control plane or Postgres was down, or the answer
-- was lost). The request id a worker gives each request is unique, so it
-- is the event's identity: a redelivered event is stored once.
--
-- Rows written before this migration may repeat a request id only through
-- such a retry; keep the first of each.
DELETE FROM route_events r
USING route_events older
WHERE r.request_id = older.request_id AND older.id < r.id;

DROP INDEX IF EXISTS route_events_request_id_idx;
CREATE UNIQUE INDEX route_events_request_id_key ON route_events (request_id);
