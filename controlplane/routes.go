package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pricing"
)

// Bounds on one route event, so a confused worker cannot store unbounded
// rows. A request makes at most a handful of attempts, plus its holds.
const (
	maxRequestIDLen   = 128
	maxAttemptRecords = 100
	// maxLineLen bounds a hold reason and a verdict: one line each.
	maxLineLen = 1024
)

type routeService struct {
	weirv1connect.UnimplementedRouteServiceHandler
	store
	now func() time.Time
}

func (r routeService) ListRouteEvents(ctx context.Context, req *connect.Request[weirv1.ListRouteEventsRequest]) (*connect.Response[weirv1.ListRouteEventsResponse], error) {
	limit, err := pageLimit("limit", req.Msg.Limit, 50, 1000)
	if err != nil {
		return nil, err
	}
	p := db.ListRouteEventsParams{MaxRows: limit, SpilledOnly: req.Msg.SpilledOnly, HeldOnly: req.Msg.HeldOnly}
	if req.Msg.AccountId != "" {
		acct, err := r.findAccount(ctx, req.Msg.AccountId)
		if err != nil {
			return nil, err
		}
		p.AccountID = uuid.NullUUID{UUID: acct.ID, Valid: true}
	}
	rows, err := r.q.ListRouteEvents(ctx, p)
	if err != nil {
		return nil, err
	}
	out, err := routeEventProtos(rows)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ListRouteEventsResponse{Events: out}), nil
}

func (r routeService) GetRouteEvent(ctx context.Context, req *connect.Request[weirv1.GetRouteEventRequest]) (*connect.Response[weirv1.GetRouteEventResponse], error) {
	id := req.Msg.RequestId
	if id == "" {
		return nil, invalidf("request_id: required")
	}
	row, err := r.q.GetRouteEvent(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("route event %q: %w", id, storeErr(err))
	}
	ev, err := routeEventProto(row)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.GetRouteEventResponse{Event: ev}), nil
}

// routeEventProto is a stored event as the API returns it.
// routeEventProtos is routeEventProto over rows.
func routeEventProtos(rows []db.RouteEvent) ([]*weirv1.RouteEvent, error) {
	out := make([]*weirv1.RouteEvent, 0, len(rows))
	for _, e := range rows {
		ev, err := routeEventProto(e)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

func routeEventProto(e db.RouteEvent) (*weirv1.RouteEvent, error) {
	ev := &weirv1.RouteEvent{
		RequestId:        e.RequestID,
		Model:            e.Model,
		Status:           e.Status,
		Attempts:         e.Attempts,
		Duration:         millisDuration(e.DurationMs),
		InputTokens:      e.InputTokens,
		OutputTokens:     e.OutputTokens,
		Stream:           e.Stream,
		ErrorType:        e.ErrorType,
		Surface:          e.Surface,
		StartedAt:        timestamppb.New(e.StartedAt),
		HoldCount:        e.HoldCount,
		FailureStage:     enumValue[weirv1.FailureStage](e.FailureStage),
		SpilledToMetered: e.SpilledToMetered,
	}
	ev.Pending = e.PendingUntil != nil
	ev.SessionKey, ev.CostUsd = e.SessionKey, pricing.USD(e.CostNanoUsd)
	if e.InputTokens != 0 || e.OutputTokens != 0 || e.CacheReadTokens != 0 || e.CacheCreationTokens != 0 {
		ev.Usage = &weirv1.TokenUsage{InputTokens: e.InputTokens, OutputTokens: e.OutputTokens,
			CacheReadTokens: e.CacheReadTokens, CacheCreationTokens: e.CacheCreationTokens, ReasoningTokens: e.ReasoningTokens}
	}
	if e.KeyID.Valid {
		ev.KeyId = e.KeyID.UUID.String()
	}
	if e.AccountID.Valid {
		ev.AccountId = e.AccountID.UUID.String()
	}
	if e.TtfbMs != nil {
		ev.TimeToFirstByte = millisDuration(*e.TtfbMs)
	}
	if e.HeldMs > 0 {
		ev.Held = millisDuration(e.HeldMs)
	}
	ev.HoldReason, ev.Verdict = e.HoldReason, e.Verdict
	if e.HeldSince != nil {
		ev.HeldSince = timestamppb.New(*e.HeldSince)
	}
	if e.NextTryAt != nil {
		ev.NextTryAt = timestamppb.New(*e.NextTryAt)
	}
	recs, err := decodeAttempts(e.AttemptsJson)
	if err != nil {
		return nil, fmt.Errorf("route event %d: %w", e.ID, err)
	}
	ev.AttemptRecords = recs
	return ev, nil
}

func millisDuration(ms float64) *durationpb.Duration {
	return durationpb.New(time.Duration(ms * float64(time.Millisecond)))
}

// encodeAttempts stores attempt records as a JSON array of their protojson
// forms: readable in psql, and protojson keeps enum names and durations
// stable across releases where a Go struct's JSON would not.
func encodeAttempts(recs []*weirv1.AttemptRecord) ([]byte, error) {
	// protojson writes valid JSON: the array is joined, not re-encoded.
	b := append(make([]byte, 0, 64+160*len(recs)), '[')
	for i, r := range recs {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = (protojson.MarshalOptions{}).MarshalAppend(b, r); err != nil {
			return nil, fmt.Errorf("encode attempt record: %w", err)
		}
	}
	return append(b, ']'), nil
}

// decodeAttempts reads what encodeAttempts wrote. Fields and enum names
// from a newer release are dropped, not fatal, so a rollback can still
// read what the newer release stored.
func decodeAttempts(b []byte) ([]*weirv1.AttemptRecord, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("decode attempt records: %w", err)
	}
	if len(raw) == 0 {
		return nil, nil
	}
	opts := protojson.UnmarshalOptions{DiscardUnknown: true}
	out := make([]*weirv1.AttemptRecord, 0, len(raw))
	for _, r := range raw {
		rec := &weirv1.AttemptRecord{}
		if err := opts.Unmarshal(r, rec); err != nil {
			return nil, fmt.Errorf("decode attempt record: %w", err)
		}
		out = append(out, rec)
	}
	return out, nil
}

// failureStageName is what the failure_stage column holds: "" when the
// request did not fail, and also for a value this release does not know
// (a newer worker's), since losing the whole event would be worse.
func failureStageName(v weirv1.FailureStage) string {
	if v == weirv1.FailureStage_FAILURE_STAGE_UNSPECIFIED || v.Descriptor().Values().ByNumber(v.Number()) == nil {
		return ""
	}
	return enumName(v)
}

// maxRouteBatch bounds one ReportRoutes call.
const maxRouteBatch = 500

func (l leaseService) ReportRoutes(ctx context.Context, req *connect.Request[weirv1.ReportRoutesRequest]) (*connect.Response[weirv1.ReportRoutesResponse], error) {
	if n := len(req.Msg.Events); n > maxRouteBatch {
		return nil, invalidf("events: at most %d per call, got %d", maxRouteBatch, n)
	}
	if n := len(req.Msg.Refusals); n > maxRouteBatch {
		return nil, invalidf("refusals: at most %d per call, got %d", maxRouteBatch, n)
	}
	refusals, err := refusalColumns(req.Msg.Refusals, l.now())
	if err != nil {
		return nil, err
	}
	if err := l.storeRoutes(ctx, req.Msg.Events, refusals); err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.ReportRoutesResponse{}), nil
}

// Bounds on a refusal count's fields: a worker's id is short, a reason
// one of its fixed set (a word).
const (
	maxWorkerIDLen = 64
	maxReasonLen   = 32
)

// refusalColumns checks a batch's refusal counts and lays them out as
// UpsertRefusalCounts' columns; nil when there are none. Repeats of a
// row within the batch (one statement cannot update a row twice) keep
// the larger count, as the upsert does across batches.
func refusalColumns(counts []*weirv1.RefusalCount, now time.Time) (*db.UpsertRefusalCountsParams, error) {
	if len(counts) == 0 {
		return nil, nil
	}
	type rowKey struct {
		start          time.Time
		key            uuid.UUID
		reason, worker string
	}
	at := map[rowKey]int{}
	p := &db.UpsertRefusalCountsParams{Now: now}
	for i, c := range counts {
		field := fmt.Sprintf("refusals[%d]", i)
		switch {
		case c.GetWorkerId() == "" || len(c.GetWorkerId()) > maxWorkerIDLen:
			return nil, invalidf("%s.worker_id: required, at most %d characters", field, maxWorkerIDLen)
		case c.GetReason() == "" || len(c.GetReason()) > maxReasonLen:
			return nil, invalidf("%s.reason: required, at most %d characters", field, maxReasonLen)
		case c.GetIntervalStart() == nil || c.GetIntervalStart().CheckValid() != nil:
			return nil, invalidf("%s.interval_start: required", field)
		case c.GetCount() < 0:
			return nil, invalidf("%s.count: must not be negative", field)
		}
		var key uuid.UUID // the nil uuid: no key known
		if c.GetKeyId() != "" {
			id, err := uuid.Parse(c.GetKeyId())
			if err != nil {
				return nil, invalidf("%s.key_id: not a key id", field)
			}
			key = id
		}
		k := rowKey{c.GetIntervalStart().AsTime(), key, c.GetReason(), c.GetWorkerId()}
		if j, seen := at[k]; seen {
			p.Counts[j] = max(p.Counts[j], c.GetCount())
			continue
		}
		at[k] = len(p.Counts)
		p.IntervalStarts = append(p.IntervalStarts, k.start)
		p.KeyIds = append(p.KeyIds, key)
		p.Reasons = append(p.Reasons, k.reason)
		p.WorkerIds = append(p.WorkerIds, k.worker)
		p.Counts = append(p.Counts, c.GetCount())
	}
	return p, nil
}

// ListRefusals sums the workers' refusal counts.
func (r routeService) ListRefusals(ctx context.Context, req *connect.Request[weirv1.ListRefusalsRequest]) (*connect.Response[weirv1.ListRefusalsResponse], error) {
	limit, err := pageLimit("limit", req.Msg.GetLimit(), 100, 1000)
	if err != nil {
		return nil, err
	}
	since := r.now().Add(-time.Hour)
	if s := req.Msg.GetSince(); s != nil {
		if s.CheckValid() != nil {
			return nil, invalidf("since: not a valid time")
		}
		since = s.AsTime()
	}
	p := db.ListRefusalsParams{Since: since, MaxRows: limit}
	if k := req.Msg.GetKeyId(); k != "" {
		id, err := uuid.Parse(k)
		if err != nil {
			return nil, invalidf("key_id: not a key id")
		}
		p.KeyID = uuid.NullUUID{UUID: id, Valid: true}
	}
	rows, err := r.q.ListRefusals(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListRefusalsResponse{Refusals: make([]*weirv1.Refusals, 0, len(rows))}
	for _, row := range rows {
		ref := &weirv1.Refusals{IntervalStart: timestamppb.New(row.IntervalStart), Reason: row.Reason, Count: row.Count}
		if row.KeyID != uuid.Nil {
			ref.KeyId = row.KeyID.String()
		}
		out.Refusals = append(out.Refusals, ref)
	}
	return connect.NewResponse(out), nil
}

// storeRoutes checks every event first (one bad event refuses the call,
// naming it) and stores them in one transaction: one insert statement for
// the batch, then one touch per key.
func (l leaseService) storeRoutes(ctx context.Context, events []*weirv1.RouteEvent, refusals *db.UpsertRefusalCountsParams) error {
	now := l.now()
	rows := make([]db.RouteEvent, 0, len(events))
	keys := map[uuid.UUID]bool{}
	events = finalEvents(events)
	for i, e := range events {
		r, err := routeEventParams(fmt.Sprintf("events[%d]", i), e, now)
		if err != nil {
			return err
		}
		if r.KeyID.Valid {
			keys[r.KeyID.UUID] = true
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 && refusals == nil {
		return nil
	}
	err := pgx.BeginFunc(ctx, l.pool, func(tx pgx.Tx) error {
		q := l.q.WithTx(tx)
		if refusals != nil {
			if err := q.UpsertRefusalCounts(ctx, *refusals); err != nil {
				return err
			}
		}
		if len(rows) == 0 {
			return nil
		}
		tab, err := l.prices.get(ctx, q)
		if err != nil {
			return err
		}
		if err := knownStarts(ctx, q, events, rows); err != nil {
			return err
		}
		priced := make([]pricedEvent, len(rows))
		for i, e := range events {
			priced[i] = price(tab, e)
			setUsage(&rows[i], priced[i])
		}
		written, err := q.InsertRouteEvents(ctx, routeColumns(rows, now, now.Add(l.cfg.LeaseTTL)))
		if err != nil {
			return err
		}
		// Usage is rolled up once per request: from the final events this
		// statement wrote, never from a redelivery it did not.
		var roll usageRollup
		at := make(map[string]int, len(rows))
		for i, r := range rows {
			at[r.RequestID] = i
		}
		// Spend counts against budgets once, and only for a budgeted key's
		// event.
		budgeted := make([]bool, len(rows))
		for _, w := range written {
			if i, ok := at[w.RequestID]; ok && w.Final {
				roll.add(rows[i], events[i], priced[i])
				budgeted[i] = events[i].GetBudgeted()
			}
		}
		crossed, err := addSpend(ctx, q, rows, budgeted, now)
		if err != nil {
			return err
		}
		for _, c := range crossed {
			if err := l.budgetCrossed(ctx, tx, c); err != nil {
				return err
			}
		}
		if len(roll.keys) > 0 {
			if err := q.AddUsageHourly(ctx, roll.params()); err != nil {
				return err
			}
		}
		for id := range keys {
			if err := q.TouchKey(ctx, db.TouchKeyParams{ID: id, Now: now, StaleBefore: now.Add(-time.Minute)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return nil
}

// knownStarts gives an event sent without its request's start (a worker
// always sends one) the start of its request's stored event, if any: an
// event replaces the stored one only under the same started_at, the
// partition key (0036_partitioned_events.sql), so its final event must
// not take the control plane's clock a second time.
func knownStarts(ctx context.Context, q *db.Queries, events []*weirv1.RouteEvent, rows []db.RouteEvent) error {
	var ids []string
	for i, e := range events {
		if e.StartedAt == nil {
			ids = append(ids, rows[i].RequestID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	stored, err := q.RouteEventStarts(ctx, ids)
	if err != nil {
		return err
	}
	start := make(map[string]time.Time, len(stored))
	for _, s := range stored {
		start[s.RequestID] = s.StartedAt
	}
	for i, e := range events {
		if at, ok := start[rows[i].RequestID]; ok && e.StartedAt == nil {
			rows[i].StartedAt = at
		}
	}
	return nil
}

// setUsage puts a request's priced usage on its row.
func setUsage(r *db.RouteEvent, p pricedEvent) {
	t := p.total
	if len(p.uses) == 0 {
		return // nothing reported per attempt: the event's own totals stand
	}
	r.InputTokens, r.OutputTokens = t.input, t.output
	r.CacheReadTokens, r.CacheCreationTokens, r.ReasoningTokens = t.cacheRead, t.cacheCreation, t.reasoning
	r.CostNanoUsd = t.nano
}

// routeColumns lays rows out as InsertRouteEvents' column arrays.
// finalEvents keeps one event per request id, in the batch's order: a
// request that was held and then finished within one batch has its
// pending event and its final one in it, and the final one stands.
func finalEvents(events []*weirv1.RouteEvent) []*weirv1.RouteEvent {
	at := make(map[string]int, len(events))
	out := events[:0:0]
	for _, e := range events {
		i, seen := at[e.GetRequestId()]
		switch {
		case !seen:
			at[e.GetRequestId()] = len(out)
			out = append(out, e)
		case out[i].GetPending():
			// The final event, or the hold going on.
			out[i] = e
		}
	}
	return out
}

// routeColumns turns rows into the insert's columns; a pending event is
// kept open until pendingUntil.
func routeColumns(rows []db.RouteEvent, now, pendingUntil time.Time) db.InsertRouteEventsParams {
	n := len(rows)
	p := db.InsertRouteEventsParams{
		Now: now, PendingUntil: pendingUntil, Pendings: make([]bool, n), RequestIds: make([]string, n), KeyIds: make([]uuid.UUID, n), AccountIds: make([]uuid.UUID, n),
		Surfaces: make([]string, n), Models: make([]string, n), Streams: make([]bool, n), Statuses: make([]int32, n),
		ErrorTypes: make([]string, n), AttemptCounts: make([]int32, n), DurationsMs: make([]float64, n),
		HasTtfb: make([]bool, n), TtfbsMs: make([]float64, n), InputTokens: make([]int64, n),
		OutputTokens: make([]int64, n), StartedAts: make([]time.Time, n), HeldsMs: make([]float64, n),
		HoldCounts: make([]int32, n), FailureStages: make([]string, n), AttemptsJsons: make([]string, n),
		Spilled: make([]bool, n), Held: make([]bool, n), HeldSinces: make([]time.Time, n), HoldReasons: make([]string, n),
		NextTryAts: make([]time.Time, n), Verdicts: make([]string, n), SessionKeys: make([]string, n),
		CacheReadTokens: make([]int64, n), CacheCreationTokens: make([]int64, n), ReasoningTokens: make([]int64, n),
		CostsNanoUsd: make([]int64, n),
	}
	for i, r := range rows {
		p.RequestIds[i], p.KeyIds[i], p.AccountIds[i] = r.RequestID, r.KeyID.UUID, r.AccountID.UUID
		p.Surfaces[i], p.Models[i], p.Streams[i], p.Statuses[i] = r.Surface, r.Model, r.Stream, r.Status
		p.ErrorTypes[i], p.AttemptCounts[i], p.DurationsMs[i] = r.ErrorType, r.Attempts, r.DurationMs
		if r.TtfbMs != nil {
			p.HasTtfb[i], p.TtfbsMs[i] = true, *r.TtfbMs
		}
		p.InputTokens[i], p.OutputTokens[i], p.StartedAts[i] = r.InputTokens, r.OutputTokens, r.StartedAt
		p.HeldsMs[i], p.HoldCounts[i], p.FailureStages[i] = r.HeldMs, r.HoldCount, r.FailureStage
		p.AttemptsJsons[i], p.Spilled[i] = string(r.AttemptsJson), r.SpilledToMetered
		p.Pendings[i] = r.PendingUntil != nil
		p.HoldReasons[i], p.Verdicts[i] = r.HoldReason, r.Verdict
		p.SessionKeys[i], p.CacheReadTokens[i], p.CacheCreationTokens[i] = r.SessionKey, r.CacheReadTokens, r.CacheCreationTokens
		p.ReasoningTokens[i], p.CostsNanoUsd[i] = r.ReasoningTokens, r.CostNanoUsd
		if r.HeldSince != nil && r.NextTryAt != nil {
			p.Held[i], p.HeldSinces[i], p.NextTryAts[i] = true, *r.HeldSince, *r.NextTryAt
		} else {
			p.HeldSinces[i], p.NextTryAts[i] = now, now
		}
	}
	return p
}

// routeEventParams checks one route event and turns it into its row (ID
// and RecordedAt are the insert's).
func routeEventParams(field string, e *weirv1.RouteEvent, now time.Time) (db.RouteEvent, error) {
	switch {
	case e == nil || e.RequestId == "":
		return db.RouteEvent{}, invalidf("%s.request_id: required", field)
	case len(e.RequestId) > maxRequestIDLen:
		return db.RouteEvent{}, invalidf("%s.request_id: at most %d characters", field, maxRequestIDLen)
	case len(e.AttemptRecords) > maxAttemptRecords:
		return db.RouteEvent{}, invalidf("%s.attempt_records: at most %d, got %d", field, maxAttemptRecords, len(e.AttemptRecords))
	case e.HoldCount < 0:
		return db.RouteEvent{}, invalidf("%s.hold_count: must not be negative", field)
	case e.Held.AsDuration() < 0:
		return db.RouteEvent{}, invalidf("%s.held: must not be negative", field)
	case len(e.SessionKey) > maxSessionKeyLen:
		return db.RouteEvent{}, invalidf("%s.session_key: at most %d characters", field, maxSessionKeyLen)
	}
	if err := checkUsage(field+".usage", e.Usage); err != nil {
		return db.RouteEvent{}, err
	}
	for i, a := range e.AttemptRecords {
		if err := checkUsage(fmt.Sprintf("%s.attempt_records[%d].usage", field, i), a.GetUsage()); err != nil {
			return db.RouteEvent{}, err
		}
	}
	attempts, err := encodeAttempts(e.AttemptRecords)
	if err != nil {
		return db.RouteEvent{}, invalidf("%s.attempt_records: %v", field, err)
	}
	p := db.RouteEvent{
		RequestID:        e.RequestId,
		Surface:          e.Surface,
		Model:            e.Model,
		Stream:           e.Stream,
		Status:           e.Status,
		ErrorType:        e.ErrorType,
		Attempts:         e.Attempts,
		DurationMs:       durationMillis(e.Duration),
		InputTokens:      e.InputTokens,
		OutputTokens:     e.OutputTokens,
		StartedAt:        now,
		HeldMs:           durationMillis(e.Held),
		HoldCount:        e.HoldCount,
		FailureStage:     failureStageName(e.FailureStage),
		AttemptsJson:     attempts,
		SpilledToMetered: e.SpilledToMetered,
		SessionKey:       e.SessionKey,
	}
	if u := e.Usage; u != nil {
		p.InputTokens, p.OutputTokens = u.InputTokens, u.OutputTokens
		p.CacheReadTokens, p.CacheCreationTokens, p.ReasoningTokens = u.CacheReadTokens, u.CacheCreationTokens, u.ReasoningTokens
	}
	if e.Pending {
		// In progress: routeColumns sets until when it is kept open.
		p.PendingUntil, p.ErrorType = &now, "in_progress"
		if e.HeldSince != nil && e.NextTryAt != nil {
			since, next := e.HeldSince.AsTime(), e.NextTryAt.AsTime()
			p.HeldSince, p.NextTryAt, p.HoldReason = &since, &next, policy.Truncate(e.HoldReason, maxLineLen)
		}
	}
	p.Verdict = policy.Truncate(e.Verdict, maxLineLen)
	if e.StartedAt != nil {
		p.StartedAt = e.StartedAt.AsTime()
	}
	if e.TimeToFirstByte != nil {
		ms := durationMillis(e.TimeToFirstByte)
		p.TtfbMs = &ms
	}
	if id, err := uuid.Parse(e.KeyId); err == nil {
		p.KeyID = uuid.NullUUID{UUID: id, Valid: true}
	}
	if id, err := uuid.Parse(e.AccountId); err == nil {
		p.AccountID = uuid.NullUUID{UUID: id, Valid: true}
	}
	return p, nil
}
