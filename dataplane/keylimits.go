package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/modelpattern"
)

// admitModel applies the key's model allowlist to a request whose body
// was read, before anything is leased (on the model as asked; the control
// plane narrows an alias's targets to the list). Leases reused by the
// pool are per key, so a request admitted here may still be served
// without an Acquire.
func (s *Server) admitModel(in *inbound, k verifiedKey) *apiError {
	if !modelpattern.Match(k.allowedModels, in.model) {
		in.outcome, in.refusal = outcomeModelForbidden, refusalModelForbidden
		return errModelNotAllowed(in.model)
	}
	return nil
}

// admitKey applies the key's rate limit before its request's body is
// read: a key limited to one request a minute must not get to fill the
// worker's memory with bodies it may not send. A key with a limit takes
// one token per request from the control plane's bucket, shared by every
// worker; a key without one costs nothing here.
//
// A refusal says when the key's next request is admitted; until then the
// worker refuses the key's requests itself (limitedKeys), without asking:
// a client hammering past its limit costs the control plane one call per
// retry-after, not one per request.
func (s *Server) admitKey(ctx context.Context, in *inbound, k verifiedKey) *apiError {
	if k.ratePerMinute == 0 {
		return nil
	}
	now := s.cfg.Now()
	if until, perMinute, ok := s.limited.until(in.keyHash, now); ok {
		in.outcome, in.refusal = outcomeKeyRateLimited, refusalKeyRateLimit
		return errKeyRateLimited(perMinute, until.Sub(now))
	}
	resp, err := s.leases.TakeRequestToken(ctx, connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: in.keyHash}))
	switch {
	case connect.CodeOf(err) == connect.CodePermissionDenied:
		s.keys.forget(in.keyHash)
		in.outcome, in.refusal = outcomeUnauthenticated, refusalInvalidKey
		return errAuthentication("invalid API key")
	case err != nil:
		if ctx.Err() == nil {
			s.cfg.Logger.WarnContext(ctx, "take request token failed", "request_id", in.requestID, "err", err)
		}
		in.outcome, in.refusal = outcomeUnavailable, refusalControlPlane
		return errControlPlane()
	case !resp.Msg.Admitted:
		in.outcome, in.refusal = outcomeKeyRateLimited, refusalKeyRateLimit
		wait := resp.Msg.RetryAfter.AsDuration()
		s.limited.set(in.keyHash, now.Add(wait), resp.Msg.RateLimitPerMinute)
		return errKeyRateLimited(resp.Msg.RateLimitPerMinute, wait)
	}
	return nil
}

// limitedKeys are the keys whose rate limit refused a request, until
// when the control plane said their next request is admitted. Only
// verified keys with a limit are in it; an entry goes when it is past.
type limitedKeys struct {
	mu sync.Mutex
	m  map[string]limitedKey // by key hash
}

type limitedKey struct {
	until     time.Time
	perMinute int32
}

func (l *limitedKeys) until(key string, now time.Time) (time.Time, int32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[key]
	if ok && !now.Before(e.until) {
		delete(l.m, key)
		ok = false
	}
	return e.until, e.perMinute, ok
}

// clear forgets every entry: a key changed (its limit lifted, say).
func (l *limitedKeys) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.m)
}

func (l *limitedKeys) set(key string, until time.Time, perMinute int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[key] = limitedKey{until: until, perMinute: perMinute}
}

// errModelNotAllowed names the model, never the key.
func errModelNotAllowed(model string) *apiError {
	return &apiError{status: http.StatusForbidden, typ: "permission_error", code: "model_not_allowed", final: true,
		message: fmt.Sprintf("weir: model %q is not allowed for this weir key (its allowlist does not include it)", model)}
}

// errKeyRateLimited says it is the weir key's own limit, so that nobody
// goes looking at the provider's.
func errKeyRateLimited(perMinute int32, wait time.Duration) *apiError {
	wait = max(wait, time.Second)
	return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "rate_limit_exceeded",
		retryAfter: wait, message: fmt.Sprintf("weir: this weir key's request limit (%d per minute) is reached; "+
			"retry in %s. It is the limit set on the key in weir, not the provider's.", perMinute, retryAfterSeconds(wait)+"s")}
}

// modelNotAllowedIn reads the model from Acquire's refusal of a model
// outside the key's allowlist.
func modelNotAllowedIn(err error) (string, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodePermissionDenied {
		return "", false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if m, ok := v.(*weirv1.ModelNotAllowed); ok {
				return m.Model, true
			}
		}
	}
	return "", false
}

// filterModelList keeps, of a /v1/models page, the models the key may ask
// for; first_id and last_id follow what is kept, the rest of the page
// (has_more among it) goes as it came. A page it cannot read goes as it
// came too: the list is a convenience, the allowlist is enforced on each
// request.
func filterModelList(body []byte, patterns []string) []byte {
	var page map[string]json.RawMessage
	if json.Unmarshal(body, &page) != nil {
		return body
	}
	var data []json.RawMessage
	if json.Unmarshal(page["data"], &data) != nil {
		return body
	}
	kept := make([]json.RawMessage, 0, len(data))
	var first, last any
	for _, m := range data {
		var head struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m, &head) != nil || head.ID == "" || !modelpattern.Match(patterns, head.ID) {
			continue
		}
		if first == nil {
			first = head.ID
		}
		last = head.ID
		kept = append(kept, m)
	}
	set := func(k string, v any) {
		if b, err := json.Marshal(v); err == nil {
			page[k] = b
		}
	}
	set("data", kept)
	if _, ok := page["first_id"]; ok {
		set("first_id", first)
	}
	if _, ok := page["last_id"]; ok {
		set("last_id", last)
	}
	out, err := json.Marshal(page)
	if err != nil {
		return body
	}
	return out
}

// modelNotServedIn reads Acquire's refusal of an alias whose targets the
// surface does not serve (weirv1.ModelNotServed), returning the alias.
func modelNotServedIn(err error) (string, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInvalidArgument {
		return "", false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if m, ok := v.(*weirv1.ModelNotServed); ok {
				return m.Model, true
			}
		}
	}
	return "", false
}

// errModelNotServed is that refusal for the client: a 400 naming the
// alias and its targets, final (the request itself is at fault).
func errModelNotServed(err error) *apiError {
	var ce *connect.Error
	msg := err.Error()
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", code: "model_not_served", final: true,
		message: "weir: " + msg}
}
