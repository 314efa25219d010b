package controlplane

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgtype"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/egress"
)

// The audit log: one audit_events row per admin call that could change
// something (its proto method is not NO_SIDE_EFFECTS; LeaseService, the
// data plane's, is not audited), refused and failed calls included. The
// token interceptor runs first, so an unauthenticated call never reaches
// the table (a flood of them would fill it); it is counted in
// weir_controlplane_rpc_unauthenticated_total instead.
//
// The row is written after the call, with its outcome. The call has then
// happened: if the write fails, the caller still gets the call's own
// answer, and the failure is logged at error level and counted in
// weir_controlplane_audit_write_failures_total (alert on it). Failing the
// call instead would report a change as not made while it was.

const (
	// ActorHeader carries who an admin-token caller says they are. It is
	// self-declared: the credential is what the control plane checked. A
	// person signed in with OpenID Connect is named by their verified
	// email instead.
	ActorHeader = "Weir-Actor"
	// maxActorLen bounds the declared actor kept in a row.
	maxActorLen = 128
	// auditWriteTimeout bounds the write, which outlives a cancelled call.
	auditWriteTimeout = 5 * time.Second
)

// auditFields lists, per request message, the fields whose values an
// audit row keeps (a message-typed field with everything under it). Any
// other field the request set is recorded by name only, under "redacted":
// this fails closed, so a new field or a new RPC records that it was sent
// and never what it carried. A field carrying secret material (a
// credential, a token) must never be listed; TestAuditFields checks every
// mutating admin procedure has an entry naming real fields.
var auditFields = map[protoreflect.FullName][]protoreflect.Name{
	"weir.v1.CreateAccountRequest":   {"provider", "auth_kind", "label", "base_url", "max_concurrency", "priority", "upstream_account_id", "egress_proxy"},
	"weir.v1.UpdateAccountRequest":   {"id", "update_mask", "label", "base_url", "max_concurrency", "priority", "banked_resets_enabled", "org_id", "upstream_account_id", "egress_proxy", "owner"},
	"weir.v1.PauseAccountRequest":    {"id"},
	"weir.v1.ResumeAccountRequest":   {"id"},
	"weir.v1.DeleteAccountRequest":   {"id"},
	"weir.v1.RefreshUsageRequest":    {"id"},
	"weir.v1.ClaimResetGrantRequest": {"id", "grant_id"},
	"weir.v1.CreateKeyRequest":       {"name", "allowed_models", "pinned_accounts", "rate_limit_per_minute", "metered_accounts", "team", "budgets"},
	"weir.v1.UpdateKeyRequest":       {"id", "update_mask", "allowed_models", "pinned_accounts", "rate_limit_per_minute", "metered_accounts", "team", "budgets"},
	"weir.v1.CreateTeamRequest":      {"name", "budgets"},
	"weir.v1.UpdateTeamRequest":      {"id", "update_mask", "budgets"},
	"weir.v1.DeleteTeamRequest":      {"id"},
	"weir.v1.SetPriceRequest":        {"price"},
	"weir.v1.DeletePriceRequest":     {"pattern"},
	"weir.v1.RevokeKeyRequest":       {"id"},
	"weir.v1.UpdateSettingsRequest":  {"settings", "update_mask"},
	"weir.v1.SetAliasRequest":        {"alias", "targets"},
	"weir.v1.DeleteAliasRequest":     {"alias"},
	"weir.v1.ClearCooldownRequest":   {"id"},
	"weir.v1.CreateTargetRequest":    {"name", "kind", "events"},
	"weir.v1.DeleteTargetRequest":    {"id"},
	"weir.v1.SendTestRequest":        {"id"},
}

// proxyFields are the fields holding an egress proxy URL, which may carry
// a password: a row keeps them as egress.Redact shows them
// (scheme://host:port, "direct" or ""), never whole.
var proxyFields = map[protoreflect.FullName]bool{
	"weir.v1.CreateAccountRequest.egress_proxy": true,
	"weir.v1.UpdateAccountRequest.egress_proxy": true,
	"weir.v1.Settings.egress_proxy":             true,
}

// redactProxies rewrites m's proxy fields, at any depth, to their shown
// form.
func redactProxies(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case proxyFields[fd.FullName()] && fd.Kind() == protoreflect.StringKind && !fd.IsList():
			m.Set(fd, protoreflect.ValueOfString(egress.Redact(v.String())))
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap():
			redactProxies(v.Message())
		}
		return true
	})
}

// audited says whether calls of a procedure are written to the log.
func audited(spec connect.Spec) bool {
	return !spec.IsClient &&
		spec.IdempotencyLevel != connect.IdempotencyNoSideEffects &&
		!strings.HasPrefix(spec.Procedure, "/"+weirv1connect.LeaseServiceName+"/")
}

// auditInterceptor writes the audit row of every audited call.
type auditInterceptor struct {
	q      *db.Queries
	now    func() time.Time
	log    *slog.Logger
	failed func() // counts a row that could not be written
}

func (a auditInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !audited(req.Spec()) {
			return next(ctx, req)
		}
		resp, err := next(ctx, req)
		var out any
		if resp != nil {
			out = resp.Any()
		}
		a.record(ctx, req, out, err)
		return resp, err
	}
}

func (a auditInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler: the only streaming procedure is LeaseService's
// WatchPool. An admin streaming procedure that can change something would
// need its own recording; TestAuditFields fails until it has one.
func (a auditInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// record writes one call's row; a failure is logged and counted,
// never returned (see the top of this file).
func (a auditInterceptor) record(ctx context.Context, req connect.AnyRequest, resp any, callErr error) {
	spec := req.Spec()
	outcome := "ok"
	if callErr != nil {
		outcome = connect.CodeOf(callErr).String()
	}
	msg, _ := req.Any().(proto.Message)
	out, _ := resp.(proto.Message)
	who, _ := principalOf(ctx) // the token interceptor set it: audited calls are admin calls
	row := db.RecordAuditEventParams{
		At:         a.now(),
		Actor:      who.name,
		Credential: who.credential,
		Procedure:  spec.Procedure,
		Target:     auditTarget(msg, out),
		Summary:    auditSummary(msg),
		Outcome:    outcome,
		Peer:       req.Peer().Addr,
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditWriteTimeout)
	defer cancel()
	if err := a.q.RecordAuditEvent(wctx, row); err != nil {
		a.failed()
		a.log.ErrorContext(ctx, "audit write failed", "procedure", spec.Procedure, "outcome", outcome,
			"actor", row.Actor, "target", row.Target, "err", err)
	}
}

// cleanActor keeps a declared actor printable and short: it is shown to
// operators and must not forge lines in a terminal.
func cleanActor(v string) string {
	v = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, strings.TrimSpace(v))
	if len(v) > maxActorLen {
		v = strings.ToValidUTF8(v[:maxActorLen], "")
	}
	if v == "" {
		return "unknown"
	}
	return v
}

// auditSummary is the request's allowlisted fields as JSON, plus the names
// of the other fields it set.
func auditSummary(m proto.Message) []byte {
	summary := struct {
		Fields   json.RawMessage `json:"fields"`
		Redacted []string        `json:"redacted,omitempty"`
	}{Fields: json.RawMessage("{}")}
	if m != nil {
		r := m.ProtoReflect()
		keep := auditFields[r.Descriptor().FullName()]
		kept := r.New()
		r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if slices.Contains(keep, fd.Name()) {
				kept.Set(fd, v)
			} else {
				summary.Redacted = append(summary.Redacted, string(fd.Name()))
			}
			return true
		})
		slices.Sort(summary.Redacted)
		// A copy: kept shares its messages with the request.
		shown := proto.Clone(kept.Interface())
		redactProxies(shown.ProtoReflect())
		if b, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(shown); err == nil {
			summary.Fields = b
		}
	}
	b, err := json.Marshal(summary)
	if err != nil {
		return []byte("{}")
	}
	return b
}

// auditTarget names what a call acted on: the id the request named (an
// account id or label, a key id), else what the response made (a created
// account or key), with its label or name when known; an alias by name.
func auditTarget(req, resp proto.Message) string {
	id := stringField(req, "id", "account_id")
	var name string
	if resp != nil {
		r := resp.ProtoReflect()
		r.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind || fd.IsList() || fd.IsMap() {
				return true
			}
			entity := v.Message().Interface()
			if eid := stringField(entity, "id"); eid != "" {
				if id == "" {
					id = eid
				}
				name = stringField(entity, "label", "name")
				return false
			}
			return true
		})
	}
	if name == "" {
		name = stringField(req, "label", "name", "alias")
	}
	switch {
	case id != "" && name != "" && id != name:
		return id + " (" + name + ")"
	case id != "":
		return id
	}
	return name
}

// stringField is the first of the named string fields m has set.
func stringField(m proto.Message, names ...protoreflect.Name) string {
	if m == nil {
		return ""
	}
	r := m.ProtoReflect()
	for _, n := range names {
		fd := r.Descriptor().Fields().ByName(n)
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
			continue
		}
		if v := r.Get(fd).String(); v != "" {
			return v
		}
	}
	return ""
}

type auditService struct {
	weirv1connect.UnimplementedAuditServiceHandler
	q *db.Queries
}

func (h auditService) ListAuditEvents(ctx context.Context, req *connect.Request[weirv1.ListAuditEventsRequest]) (*connect.Response[weirv1.ListAuditEventsResponse], error) {
	m := req.Msg
	size := m.PageSize
	switch {
	case size < 0:
		return nil, invalidf("page_size: must not be negative")
	case size == 0:
		size = 50
	case size > 500:
		size = 500
	}
	p := db.ListAuditEventsParams{MaxRows: size + 1, Targets: m.Targets}
	if p.Targets == nil {
		p.Targets = []string{}
	}
	if m.Since != nil {
		t := m.Since.AsTime()
		p.Since = &t
	}
	if m.Until != nil {
		t := m.Until.AsTime()
		p.Until = &t
	}
	if m.Actor != "" {
		p.Actor = &m.Actor
	}
	if m.Procedure != "" {
		p.Procedure = &m.Procedure
	}
	if m.PageToken != "" {
		at, id, err := parseAuditCursor(m.PageToken)
		if err != nil {
			return nil, err
		}
		p.BeforeAt, p.BeforeID = &at, pgtype.Int8{Int64: id, Valid: true}
	}
	rows, err := h.q.ListAuditEvents(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListAuditEventsResponse{}
	if len(rows) > int(size) {
		rows = rows[:size]
		last := rows[len(rows)-1]
		out.NextPageToken = auditCursor(last.At, last.ID)
	}
	for _, r := range rows {
		out.Events = append(out.Events, &weirv1.AuditEvent{
			Id: r.ID, At: timestamppb.New(r.At), Actor: r.Actor, Credential: r.Credential,
			Procedure: r.Procedure, Target: r.Target, Summary: string(r.Summary),
			Outcome: r.Outcome, Peer: r.Peer,
		})
	}
	return connect.NewResponse(out), nil
}

// auditCursor is an opaque page token: the last row's time and id.
func auditCursor(at time.Time, id int64) string {
	b := binary.BigEndian.AppendUint64(nil, uint64(at.UnixMicro()))
	b = binary.BigEndian.AppendUint64(b, uint64(id))
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseAuditCursor(tok string) (time.Time, int64, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) != 16 {
		return time.Time{}, 0, invalidf("page_token: not a token this service returned")
	}
	return time.UnixMicro(int64(binary.BigEndian.Uint64(b))).UTC(), int64(binary.BigEndian.Uint64(b[8:])), nil
}
