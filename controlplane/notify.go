package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	"github.com/weirhq/weir/controlplane/policy"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/vocab"
)

// Notifications (docs/notifications.md): NotifyService manages the
// targets; the Server delivers (DeliverNotification, one River job per
// delivery) and runs the watch (WatchNotifications, a periodic River
// job); package notify holds the events, payloads and transitions.

// The sealed fields of a target (seal.Sealer.SealTarget).
const (
	targetURLField    = "url"
	targetSecretField = "secret"
)

// minTargetSecret is the shortest signing secret an operator may give.
const minTargetSecret = 16

// notifyWatchLock is the advisory lock the watch runs under ("weirwtch").
const notifyWatchLock = 0x7765697277746368

type notifyService struct {
	weirv1connect.UnimplementedNotifyServiceHandler
	store
	seal     *seal.Sealer
	notifier *notify.Notifier
	now      func() time.Time
	log      *slog.Logger
}

func (s *Server) notifyService() notifyService {
	return notifyService{store: s.store, seal: s.seal, notifier: s.notifier, now: s.now, log: s.log}
}

func (h notifyService) CreateTarget(ctx context.Context, req *connect.Request[weirv1.CreateTargetRequest]) (*connect.Response[weirv1.CreateTargetResponse], error) {
	m := req.Msg
	if err := validTargetName(m.Name); err != nil {
		return nil, err
	}
	kind := m.Kind
	if kind == weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_UNSPECIFIED {
		kind = weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_WEBHOOK
	}
	if err := notify.CheckURL(m.Url); err != nil {
		return nil, invalidf("url: %v", err)
	}
	var events []string
	for _, ev := range m.Events {
		if !slices.Contains(notify.Kinds(), ev) {
			return nil, invalidf("events: unknown event kind %q (want %v)", ev, notify.Kinds())
		}
		if !slices.Contains(events, ev) {
			events = append(events, ev)
		}
	}
	id := uuid.New()
	secret, generated := m.Secret, ""
	var sealedSecret []byte
	switch kind {
	case weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_SLACK:
		if secret != "" {
			return nil, invalidf("secret: a Slack target is not signed; its URL is its secret")
		}
	case weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_WEBHOOK:
		if secret == "" {
			secret = notify.NewSecret()
			generated = secret
		} else if len(secret) < minTargetSecret {
			return nil, invalidf("secret: at least %d characters", minTargetSecret)
		}
		sealedSecret = h.seal.SealTarget(id, targetSecretField, secret)
	default:
		return nil, invalidf("kind: want webhook or slack")
	}
	row, err := h.q.CreateNotifyTarget(ctx, db.CreateNotifyTargetParams{
		ID: id, Name: m.Name, Kind: vocab.Name(kind), UrlSealed: h.seal.SealTarget(id, targetURLField, m.Url),
		UrlHint: notify.URLHint(m.Url), SecretSealed: sealedSecret, Events: orNoEvents(events), Now: h.now(),
	})
	if err != nil {
		return nil, storeErr(err)
	}
	h.log.InfoContext(ctx, "notification target created", "target", row.Name, "kind", row.Kind, "url", row.UrlHint, "events", row.Events)
	return connect.NewResponse(&weirv1.CreateTargetResponse{Target: targetProto(row), Secret: generated}), nil
}

func (h notifyService) ListTargets(ctx context.Context, _ *connect.Request[weirv1.ListTargetsRequest]) (*connect.Response[weirv1.ListTargetsResponse], error) {
	rows, err := h.q.ListNotifyTargets(ctx)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListTargetsResponse{Targets: make([]*weirv1.NotifyTarget, 0, len(rows)), EventKinds: notify.Kinds()}
	for _, r := range rows {
		out.Targets = append(out.Targets, targetProto(r))
	}
	return connect.NewResponse(out), nil
}

func (h notifyService) DeleteTarget(ctx context.Context, req *connect.Request[weirv1.DeleteTargetRequest]) (*connect.Response[weirv1.DeleteTargetResponse], error) {
	t, err := h.target(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	if n, err := h.q.DeleteNotifyTarget(ctx, t.ID); err != nil {
		return nil, err
	} else if n == 0 {
		return nil, ErrNotFound
	}
	h.log.InfoContext(ctx, "notification target deleted", "target", t.Name, "id", t.ID)
	return connect.NewResponse(&weirv1.DeleteTargetResponse{}), nil
}

func (h notifyService) ListDeliveries(ctx context.Context, req *connect.Request[weirv1.ListDeliveriesRequest]) (*connect.Response[weirv1.ListDeliveriesResponse], error) {
	m := req.Msg
	limit := m.Limit
	switch {
	case limit < 0 || limit > 500:
		return nil, invalidf("limit: %d is out of range; must be between 0 and 500", limit)
	case limit == 0:
		limit = 20
	}
	p := db.ListNotifyDeliveriesParams{MaxRows: limit}
	if m.Target != "" {
		t, err := h.target(ctx, m.Target)
		if err != nil {
			return nil, err
		}
		p.TargetID = uuid.NullUUID{UUID: t.ID, Valid: true}
	}
	if m.DeliveryId != 0 {
		p.DeliveryID = pgtype.Int8{Int64: m.DeliveryId, Valid: true}
	}
	rows, err := h.q.ListNotifyDeliveries(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListDeliveriesResponse{Deliveries: make([]*weirv1.NotifyDelivery, 0, len(rows))}
	for _, r := range rows {
		out.Deliveries = append(out.Deliveries, deliveryProto(r))
	}
	return connect.NewResponse(out), nil
}

func (h notifyService) SendTest(ctx context.Context, req *connect.Request[weirv1.SendTestRequest]) (*connect.Response[weirv1.SendTestResponse], error) {
	t, err := h.target(ctx, req.Msg.Id)
	if err != nil {
		return nil, err
	}
	var enq notify.Enqueued
	if err := pgx.BeginFunc(ctx, h.pool, func(tx pgx.Tx) error {
		enq, err = h.notifier.EnqueueTest(ctx, tx, t.ID, t.Name)
		return err
	}); err != nil {
		return nil, err
	}
	if len(enq.Deliveries) != 1 {
		return nil, fmt.Errorf("test notification: %d deliveries made, want 1", len(enq.Deliveries))
	}
	rows, err := h.q.ListNotifyDeliveries(ctx, db.ListNotifyDeliveriesParams{
		DeliveryID: pgtype.Int8{Int64: enq.Deliveries[0], Valid: true}, MaxRows: 1,
	})
	if err != nil || len(rows) != 1 {
		return nil, errors.Join(err, ErrNotFound)
	}
	h.log.InfoContext(ctx, "test notification raised", "target", t.Name, "delivery", rows[0].ID)
	return connect.NewResponse(&weirv1.SendTestResponse{Delivery: deliveryProto(rows[0])}), nil
}

// target is a target by its id or name.
func (h notifyService) target(ctx context.Context, ref string) (db.NotifyTarget, error) {
	if ref == "" {
		return db.NotifyTarget{}, invalidf("id: name a target by its id or name")
	}
	t, err := h.q.GetNotifyTarget(ctx, ref)
	return t, storeErr(err)
}

// validTargetName admits 1 to 64 letters, digits, dots, dashes and
// underscores: a name a shell and a table show as it is.
func validTargetName(name string) error {
	bad := name == "" || len(name) > 64
	for _, r := range name {
		bad = bad || !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}
	if bad {
		return invalidf("name: 1 to 64 letters, digits, dots, dashes or underscores")
	}
	return nil
}

func orNoEvents(events []string) []string {
	if events == nil {
		return []string{}
	}
	return events
}

func targetProto(r db.NotifyTarget) *weirv1.NotifyTarget {
	return &weirv1.NotifyTarget{Id: r.ID.String(), Name: r.Name, Kind: vocab.Value[weirv1.NotifyTargetKind](r.Kind),
		UrlHint: r.UrlHint, Events: r.Events, CreatedAt: timestamppb.New(r.CreatedAt)}
}

func deliveryProto(r db.ListNotifyDeliveriesRow) *weirv1.NotifyDelivery {
	d := &weirv1.NotifyDelivery{Id: r.ID, TargetId: r.TargetID.String(), TargetName: r.TargetName,
		EventKind: r.EventKind, DedupKey: r.DedupKey, Severity: r.Severity, Text: r.Text,
		Status: vocab.Value[weirv1.NotifyDeliveryStatus](r.Status), Attempts: r.Attempts, LastError: r.LastError,
		CreatedAt: timestamppb.New(r.CreatedAt), UpdatedAt: timestamppb.New(r.UpdatedAt)}
	if r.DeliveredAt != nil {
		d.DeliveredAt = timestamppb.New(*r.DeliveredAt)
	}
	return d
}

// DeliverNotification makes one attempt at a delivery (jobs.Notifications):
// it opens the target's URL and secret, posts the event, and records the
// outcome. A delivery gone (its target deleted) or already ended is done.
func (s *Server) DeliverNotification(ctx context.Context, id int64, attempt int, last bool) error {
	row, err := s.q.GetNotifyDelivery(ctx, id)
	if errors.Is(storeErr(err), ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read delivery %d: %w", id, err)
	}
	if row.Status != vocab.Name(weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_PENDING) {
		return nil
	}
	t := notify.Target{Kind: row.TargetKind}
	var sendErr error
	if t.URL, err = s.seal.OpenTarget(row.TargetID, targetURLField, row.UrlSealed); err != nil {
		sendErr = errors.New("the target's URL opens with none of this control plane's secret keys")
	} else if t.Kind == notify.KindWebhook {
		if t.Secret, err = s.seal.OpenTarget(row.TargetID, targetSecretField, row.SecretSealed); err != nil {
			sendErr = errors.New("the target's signing secret opens with none of this control plane's secret keys")
		}
	}
	if sendErr == nil {
		p := notify.Payload{ID: row.EventID, Kind: row.EventKind, Severity: notify.Severity(row.Severity), Text: row.Text,
			DedupKey: row.DedupKey, OccurredAt: row.EventCreatedAt, Fields: row.Fields}
		sendErr = notify.Send(ctx, s.cfg.NotifyClient, t, p, s.now(), id)
	}
	if sendErr != nil && ctx.Err() != nil {
		return ctx.Err() // shutting down: the attempt is River's to run again
	}
	log := s.log.With("delivery", id, "target", row.TargetName, "event", row.EventKind, "attempt", attempt)
	if sendErr == nil {
		if err := s.q.MarkNotifyDelivered(ctx, db.MarkNotifyDeliveredParams{ID: id, Attempts: int32(attempt), Now: s.now()}); err != nil {
			return fmt.Errorf("record delivery %d: %w", id, err)
		}
		log.InfoContext(ctx, "notification delivered")
		return nil
	}
	status := weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_PENDING
	if last {
		status = weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_FAILED
	}
	if err := s.q.RecordNotifyFailure(ctx, db.RecordNotifyFailureParams{
		ID: id, Status: vocab.Name(status), Attempts: int32(attempt), LastError: sendErr.Error(), Now: s.now(),
	}); err != nil {
		return fmt.Errorf("record delivery %d: %w", id, err)
	}
	log.WarnContext(ctx, "notification delivery failed", "err", sendErr, "final", last)
	return sendErr
}

// WatchNotifications runs the watch once (jobs.Notifications): under its
// advisory lock, in one transaction, it reads the accounts, gates and open
// breakers, asks notify.Evaluate what changed since the marks, writes the
// marks and raises the events.
func (s *Server) WatchNotifications(ctx context.Context) error {
	st, err := s.settings.effective(ctx)
	if err != nil {
		return err
	}
	th := notify.Thresholds{PoolLow: int(st.GetPoolLowAccounts()), BreakerAfter: st.GetBreakerNotifyAfter().AsDuration()}
	var raised []notify.Event
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		raised = nil
		q := s.q.WithTx(tx)
		if err := q.LockNotifyWatch(ctx, notifyWatchLock); err != nil {
			return err
		}
		now := s.now()
		obs, err := observe(ctx, q, now)
		if err != nil {
			return err
		}
		rows, err := q.ListNotifyMarks(ctx)
		if err != nil {
			return err
		}
		marks := make([]notify.Mark, len(rows))
		for i, r := range rows {
			marks[i] = notify.Mark{Subject: r.Subject, Level: r.Level, Since: r.Since, Notified: r.Notified}
		}
		ch := notify.Evaluate(marks, obs, th, now)
		for _, m := range ch.Put {
			if err := q.PutNotifyMark(ctx, db.PutNotifyMarkParams{Subject: m.Subject, Level: m.Level, Since: m.Since,
				Notified: m.Notified, Now: now}); err != nil {
				return err
			}
		}
		if len(ch.Delete) > 0 {
			if err := q.DeleteNotifyMarks(ctx, ch.Delete); err != nil {
				return err
			}
		}
		for _, ev := range ch.Events {
			enq, err := s.notifier.Enqueue(ctx, tx, ev)
			if err != nil {
				return err
			}
			if !enq.Duplicate {
				raised = append(raised, ev)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("notification watch: %w", err)
	}
	for _, ev := range raised {
		s.log.InfoContext(ctx, "notification raised", "kind", ev.Kind, "severity", ev.Severity, "text", ev.Text)
	}
	return nil
}

// observe reads what the watch compares: every account, the live family
// gates, the open breakers.
func observe(ctx context.Context, q *db.Queries, now time.Time) (notify.Observed, error) {
	var obs notify.Observed
	accounts, err := q.NotifyAccounts(ctx, db.NotifyAccountsParams{Now: now, SpentAt: policy.SpentAt})
	if err != nil {
		return obs, err
	}
	for _, a := range accounts {
		obs.Accounts = append(obs.Accounts, notify.AccountState{ID: a.ID, Label: a.Label, Provider: a.Provider,
			Paused: a.Paused, BrokenAt: a.BrokenAt, BrokenReason: stringOr(a.BrokenReason), Cooling: a.Cooling, Spent: a.Spent})
	}
	gates, err := q.LiveFamilyGates(ctx, now)
	if err != nil {
		return obs, err
	}
	for _, g := range gates {
		obs.Gates = append(obs.Gates, notify.Gate{Account: g.AccountID, Family: g.Family})
	}
	breakers, err := q.ListOpenBreakers(ctx)
	if err != nil {
		return obs, err
	}
	for _, b := range breakers {
		obs.Breakers = append(obs.Breakers, notify.Breaker{Provider: b.Provider, Family: b.Family})
	}
	return obs, nil
}
