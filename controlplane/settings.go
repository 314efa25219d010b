package controlplane

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// Names of the rows in the settings table; each value is a Go duration
// string ("20m0s").
const (
	settingCapacityHold    = "capacity_hold"
	settingRequestDeadline = "request_deadline"
)

// Bounds an operator may set. A deadline under a minute would fail ordinary
// long generations; beyond six hours a request is abandoned, not held.
// capacity_hold may exceed request_deadline: the deadline ends a request's
// holds anyway, so the hold in effect is the smaller of the two, and
// rejecting the pair would only force operators to change them in order.
const (
	maxCapacityHold    = 6 * time.Hour
	minRequestDeadline = time.Minute
	maxRequestDeadline = 6 * time.Hour
)

type settingsService struct {
	weirv1connect.UnimplementedSettingsServiceHandler
	s *Server
}

func (h settingsService) GetSettings(ctx context.Context, _ *connect.Request[weirv1.GetSettingsRequest]) (*connect.Response[weirv1.GetSettingsResponse], error) {
	st, err := h.s.effectiveSettings(ctx)
	if err != nil {
		return nil, h.s.fail(ctx, "get settings", err)
	}
	return connect.NewResponse(&weirv1.GetSettingsResponse{Settings: st}), nil
}

func (h settingsService) UpdateSettings(ctx context.Context, req *connect.Request[weirv1.UpdateSettingsRequest]) (*connect.Response[weirv1.UpdateSettingsResponse], error) {
	m := req.Msg
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, toConnect(invalidf("update_mask: name at least one field (capacity_hold, request_deadline)"))
	}
	now := h.s.now()
	// Every field is checked before anything is written: a request with one
	// bad value changes nothing.
	puts := make([]db.PutSettingParams, 0, len(paths))
	for _, path := range paths {
		var d time.Duration
		var err error
		switch path {
		case settingCapacityHold:
			d, err = durationSetting("settings.capacity_hold", m.GetSettings().GetCapacityHold(), 0, maxCapacityHold)
		case settingRequestDeadline:
			d, err = durationSetting("settings.request_deadline", m.GetSettings().GetRequestDeadline(), minRequestDeadline, maxRequestDeadline)
		default:
			err = invalidf("update_mask: unknown field %q (want capacity_hold or request_deadline)", path)
		}
		if err != nil {
			return nil, toConnect(err)
		}
		puts = append(puts, db.PutSettingParams{Name: path, Value: d.String(), Now: now})
	}
	var st *weirv1.Settings
	err := h.s.tx(ctx, func(q *db.Queries) error {
		for _, p := range puts {
			if err := q.PutSetting(ctx, p); err != nil {
				return fmt.Errorf("put setting %s: %w", p.Name, err)
			}
		}
		rows, err := q.ListSettings(ctx)
		if err != nil {
			return fmt.Errorf("list settings: %w", err)
		}
		st, err = h.s.settingsFrom(rows)
		return err
	})
	if err != nil {
		return nil, h.s.fail(ctx, "update settings", err)
	}
	h.s.log.InfoContext(ctx, "settings updated", "fields", paths,
		"capacity_hold", st.CapacityHold.AsDuration(), "request_deadline", st.RequestDeadline.AsDuration())
	return connect.NewResponse(&weirv1.UpdateSettingsResponse{Settings: st}), nil
}

// WorkerSettings is what data planes poll; one small query, no locks.
func (l leaseService) WorkerSettings(ctx context.Context, _ *connect.Request[weirv1.WorkerSettingsRequest]) (*connect.Response[weirv1.WorkerSettingsResponse], error) {
	st, err := l.s.effectiveSettings(ctx)
	if err != nil {
		return nil, l.s.fail(ctx, "worker settings", err)
	}
	return connect.NewResponse(&weirv1.WorkerSettingsResponse{Settings: st}), nil
}

// effectiveSettings is what operators set, else this replica's Config.
func (s *Server) effectiveSettings(ctx context.Context) (*weirv1.Settings, error) {
	rows, err := s.q.ListSettings(ctx)
	if err != nil {
		return nil, fmt.Errorf("list settings: %w", err)
	}
	return s.settingsFrom(rows)
}

// settingsFrom overlays stored rows on the Config defaults. Names it does
// not know are skipped: a newer replica may have written them during a
// rolling upgrade. A value it cannot read is an error rather than a silent
// fall back to a default the operator did not choose.
func (s *Server) settingsFrom(rows []db.Setting) (*weirv1.Settings, error) {
	hold, deadline := s.cfg.CapacityHold, s.cfg.RequestDeadline
	for _, r := range rows {
		var dst *time.Duration
		switch r.Name {
		case settingCapacityHold:
			dst = &hold
		case settingRequestDeadline:
			dst = &deadline
		default:
			continue
		}
		d, err := time.ParseDuration(r.Value)
		if err != nil {
			return nil, fmt.Errorf("setting %s: %w", r.Name, err)
		}
		*dst = d
	}
	return &weirv1.Settings{CapacityHold: durationpb.New(hold), RequestDeadline: durationpb.New(deadline)}, nil
}

// durationSetting checks a duration field named by the update mask.
func durationSetting(field string, v *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if v == nil {
		return 0, invalidf("%s: required (it is in update_mask)", field)
	}
	if err := v.CheckValid(); err != nil {
		return 0, invalidf("%s: not a valid duration", field)
	}
	d := v.AsDuration()
	if d < lo || d > hi {
		return 0, invalidf("%s: %v is out of range; must be between %v and %v", field, d, lo, hi)
	}
	return d, nil
}
