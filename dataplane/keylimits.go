package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
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
		in.outcome = outcomeModelForbidden
		return errModelNotAllowed(in.model)
	}
	return nil
}

// admitKey applies the key's rate limit before its request's body is
// read: a key limited to one request a minute must not get to fill the
// worker's memory with bodies it may not send. A key with a limit takes
// one token per request from the control plane's bucket, shared by every
// worker; a key without one costs nothing here.
func (s *Server) admitKey(ctx context.Context, in *inbound, k verifiedKey) *apiError {
	if k.ratePerMinute == 0 {
		return nil
	}
	resp, err := s.leases.TakeRequestToken(ctx, connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: in.keyHash}))
	switch {
	case connect.CodeOf(err) == connect.CodePermissionDenied:
		s.keys.forget(in.keyHash)
		in.outcome = outcomeUnauthenticated
		return errAuthentication("invalid API key")
	case err != nil:
		s.cfg.Logger.WarnContext(ctx, "take request token failed", "request_id", in.requestID, "err", err)
		in.outcome = outcomeUnavailable
		return errControlPlane()
	case !resp.Msg.Admitted:
		in.outcome = outcomeKeyRateLimited
		return errKeyRateLimited(resp.Msg.RateLimitPerMinute, resp.Msg.RetryAfter.AsDuration())
	}
	return nil
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
