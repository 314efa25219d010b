package controlplane

import (
	"context"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

type routeService struct {
	weirv1connect.UnimplementedRouteServiceHandler
	s *Server
}

func (r routeService) ListRouteEvents(ctx context.Context, req *connect.Request[weirv1.ListRouteEventsRequest]) (*connect.Response[weirv1.ListRouteEventsResponse], error) {
	limit := req.Msg.Limit
	switch {
	case limit < 0:
		return nil, toConnect(invalidf("limit: must not be negative"))
	case limit == 0:
		limit = 50
	case limit > 1000:
		limit = 1000
	}
	p := db.ListRouteEventsParams{MaxRows: limit}
	if req.Msg.AccountId != "" {
		acct, err := r.s.findAccount(ctx, req.Msg.AccountId)
		if err != nil {
			return nil, r.s.fail(ctx, "list route events", err)
		}
		p.AccountID = uuid.NullUUID{UUID: acct.ID, Valid: true}
	}
	rows, err := r.s.q.ListRouteEvents(ctx, p)
	if err != nil {
		return nil, r.s.fail(ctx, "list route events", err)
	}
	out := make([]*weirv1.RouteEvent, 0, len(rows))
	for _, e := range rows {
		ev := &weirv1.RouteEvent{
			RequestId:    e.RequestID,
			Model:        e.Model,
			Status:       e.Status,
			Attempts:     e.Attempts,
			Duration:     millisDuration(e.DurationMs),
			InputTokens:  e.InputTokens,
			OutputTokens: e.OutputTokens,
			Stream:       e.Stream,
			ErrorType:    e.ErrorType,
			Surface:      e.Surface,
			StartedAt:    timestamppb.New(e.StartedAt),
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
		out = append(out, ev)
	}
	return connect.NewResponse(&weirv1.ListRouteEventsResponse{Events: out}), nil
}

func millisDuration(ms float64) *durationpb.Duration {
	return durationpb.New(time.Duration(ms * float64(time.Millisecond)))
}

func (l leaseService) ReportRoute(ctx context.Context, req *connect.Request[weirv1.ReportRouteRequest]) (*connect.Response[weirv1.ReportRouteResponse], error) {
	e := req.Msg.Event
	if e == nil || e.RequestId == "" {
		return nil, toConnect(invalidf("event.request_id: required"))
	}
	now := l.s.now()
	p := db.InsertRouteEventParams{
		RequestID:    e.RequestId,
		Surface:      e.Surface,
		Model:        e.Model,
		Stream:       e.Stream,
		Status:       e.Status,
		ErrorType:    e.ErrorType,
		Attempts:     e.Attempts,
		DurationMs:   durationMillis(e.Duration),
		InputTokens:  e.InputTokens,
		OutputTokens: e.OutputTokens,
		StartedAt:    now,
		Now:          now,
	}
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
	err := l.s.tx(ctx, func(q *db.Queries) error {
		if err := q.InsertRouteEvent(ctx, p); err != nil {
			return err
		}
		if p.KeyID.Valid {
			return q.TouchKey(ctx, db.TouchKeyParams{ID: p.KeyID.UUID, Now: now, StaleBefore: now.Add(-time.Minute)})
		}
		return nil
	})
	if err != nil {
		return nil, l.s.fail(ctx, "report route", err)
	}
	return connect.NewResponse(&weirv1.ReportRouteResponse{}), nil
}
