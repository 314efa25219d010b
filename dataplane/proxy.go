package dataplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// inbound is one client request, read whole before the first attempt: the
// worker needs the bytes to replay them, and handing the inbound body to
// the upstream request risks golang/go#40747.
type inbound struct {
	surface   string
	requestID string
	keyHash   string
	keyID     string
	body      []byte
	model     string
	stream    bool
	session   string
	start     time.Time
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b) //nolint:errcheck // crypto/rand.Read never fails on Linux
	return "weir_" + hex.EncodeToString(b)
}

func (s *Server) proxyHandler(surface string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		in := &inbound{surface: surface, requestID: newRequestID(), start: s.cfg.Now()}
		tw := &trackingWriter{ResponseWriter: w, now: s.cfg.Now}
		tw.Header().Set("Weir-Request-Id", in.requestID)
		rec := &weirv1.RouteEvent{RequestId: in.requestID, Surface: surface, StartedAt: timestamppb.New(in.start)}
		s.serve(tw, r, in, rec)
		rec.Status = int32(tw.status)
		rec.Duration = durationpb.New(s.cfg.Now().Sub(in.start))
		if !tw.firstByte.IsZero() {
			ttfb := tw.firstByte.Sub(in.start)
			rec.TimeToFirstByte = durationpb.New(ttfb)
			s.metrics.ttfb.WithLabelValues(surface).Observe(ttfb.Seconds())
		}
		s.metrics.requests.WithLabelValues(surface, statusClass(tw.status)).Inc()
		if in.keyID != "" {
			// Unauthenticated noise is not a route; it would only flood the table.
			s.reporter.report(rec)
		}
	}
}

// serve authenticates, reads the request, and runs the attempt loop.
func (s *Server) serve(w *trackingWriter, r *http.Request, in *inbound, rec *weirv1.RouteEvent) {
	ctx := r.Context()
	secret := clientKey(r)
	if secret == "" {
		writeAPIError(w, in.requestID, errAuthentication("missing API key: send your weir key as x-api-key or Authorization: Bearer"))
		return
	}
	in.keyHash = hashKey(secret)
	keyID, err := s.keys.verify(ctx, in.keyHash)
	if err != nil {
		if errors.Is(err, errKeyRejected) {
			writeAPIError(w, in.requestID, errAuthentication("invalid API key"))
		} else {
			s.cfg.Logger.WarnContext(ctx, "verify key failed", "request_id", in.requestID, "err", err)
			writeAPIError(w, in.requestID, errControlPlane())
		}
		return
	}
	in.keyID = keyID
	rec.KeyId = keyID
	if apiErr := s.readBody(w, r, in); apiErr != nil {
		writeAPIError(w, in.requestID, apiErr)
		return
	}
	rec.Model, rec.Stream = in.model, in.stream

	var (
		excluded []string
		last     *bufferedResponse
	)
	for attempt := 1; attempt <= s.cfg.MaxAttempts; attempt++ {
		resp, err := s.leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{
			KeyHash:           in.keyHash,
			Model:             in.model,
			SessionKey:        in.session,
			ExcludeAccountIds: excluded,
			RequestId:         in.requestID,
		}))
		if err != nil {
			switch {
			case connect.CodeOf(err) == connect.CodePermissionDenied:
				s.keys.forget(in.keyHash)
				writeAPIError(w, in.requestID, errAuthentication("invalid API key"))
			case ctx.Err() != nil:
				// The client left; nothing to answer.
			default:
				s.cfg.Logger.WarnContext(ctx, "acquire failed", "request_id", in.requestID, "err", err)
				s.answer(w, in, last, errControlPlane())
			}
			return
		}
		lease := resp.Msg.GetLease()
		if lease == nil {
			s.answer(w, in, last, noAccountError(resp.Msg.GetNoAccount(), s.cfg.Now()))
			return
		}
		rec.Attempts = int32(attempt)
		rec.AccountId = lease.AccountId
		res := s.attempt(ctx, w, r, in, lease)
		if res.outcome.InputTokens > 0 || res.outcome.OutputTokens > 0 {
			rec.InputTokens, rec.OutputTokens = res.outcome.InputTokens, res.outcome.OutputTokens
		}
		s.metrics.attempts.WithLabelValues("anthropic", strings.TrimPrefix(strings.ToLower(res.outcome.Class.String()), "outcome_class_")).Inc()
		d := s.release(ctx, in, lease, res.outcome)
		if res.failure == nil {
			// The answer, good or bad, went to the client.
			rec.ErrorType = res.outcome.ErrorType
			return
		}
		last = res.failure
		switch d.GetAction() {
		case weirv1.Action_ACTION_FAILOVER:
			excluded = append(excluded, lease.AccountId)
		case weirv1.Action_ACTION_RETRY_SAME:
			if !sleepCtx(ctx, d.GetRetryAfter().AsDuration()) {
				return
			}
		default:
			rec.ErrorType = res.outcome.ErrorType
			s.answer(w, in, last, nil)
			return
		}
	}
	s.answer(w, in, last, &apiError{status: 529, typ: "overloaded_error",
		message: "every attempt failed; weir gave up after " + strconv.Itoa(s.cfg.MaxAttempts) + " attempts", retryAfter: time.Second})
}

// answer sends the last upstream failure when there is one (it is the
// most truthful answer), else fallback.
func (s *Server) answer(w http.ResponseWriter, in *inbound, last *bufferedResponse, fallback *apiError) {
	if last != nil {
		last.write(w)
		return
	}
	if fallback != nil {
		writeAPIError(w, in.requestID, fallback)
	}
}

// readBody reads and checks the request body.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, in *inbound) *apiError {
	if r.Method == http.MethodGet {
		return nil
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return errTooLarge(s.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return errTooLarge(s.cfg.MaxBodyBytes)
		}
		return errInvalidRequest("could not read the request body")
	}
	var head struct {
		Model    *string `json:"model"`
		Stream   bool    `json:"stream"`
		Metadata struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &head); err != nil {
		return errInvalidRequest("request body is not valid JSON: " + jsonErrorText(err))
	}
	if head.Model == nil || *head.Model == "" {
		return errInvalidRequest("model: field required")
	}
	in.body, in.model, in.stream = body, *head.Model, head.Stream
	in.session = r.Header.Get("X-Claude-Code-Session-Id")
	if in.session == "" {
		in.session = head.Metadata.UserID
	}
	if len(in.session) > 256 {
		in.session = hashKey(in.session)
	}
	return nil
}

func jsonErrorText(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return syn.Error() + " at byte " + strconv.Itoa(int(syn.Offset))
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		return "field " + typ.Field + " has the wrong type"
	}
	return "malformed"
}

// release reports the outcome and returns the control plane's decision. If
// the control plane cannot be reached, the worker decides alone, the same
// way for the same evidence: fail over from what another account may
// serve, answer the rest.
func (s *Server) release(ctx context.Context, in *inbound, lease *weirv1.Lease, o *weirv1.Outcome) *weirv1.Decision {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	resp, err := s.leases.Release(rctx, connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: lease.Id, Outcome: o}))
	if err == nil {
		return resp.Msg.Decision
	}
	s.cfg.Logger.WarnContext(ctx, "release failed", "request_id", in.requestID, "err", err)
	d := &weirv1.Decision{Action: weirv1.Action_ACTION_RESPOND}
	if !o.BytesToClient {
		switch o.Class {
		case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED,
			weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
			d.Action = weirv1.Action_ACTION_FAILOVER
		}
	}
	return d
}

func errControlPlane() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "api_error",
		message: "weir control plane unavailable; retry shortly", retryAfter: 2 * time.Second}
}

// noAccountError says why nothing could serve, and when that changes.
func noAccountError(n *weirv1.NoAccount, now time.Time) *apiError {
	e := &apiError{status: 529, typ: "overloaded_error", message: "weir: " + n.GetMessage()}
	switch n.GetReason() {
	case weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED:
		e.status, e.typ, e.final = http.StatusServiceUnavailable, "api_error", true
	}
	if n.GetRetryAt() != nil {
		e.retryAfter = max(n.GetRetryAt().AsTime().Sub(now), time.Second)
	} else if n.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING {
		// Cooling with no known end: only rejected credentials remain.
		e.status, e.typ, e.final = http.StatusServiceUnavailable, "api_error", true
	}
	return e
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
