package dataplane

import (
	"net/http"
	"strconv"
	"strings"
)

// What a request may carry into the routing loop. Header values reach the
// worker already free of control characters but HTAB (net/http's header
// reader refuses a request with NUL, a bare CR or another control byte
// before any handler runs, answering its own plain-text 400: see
// docs/reliability.md; its client would refuse to send them). checkHeaders
// refuses them again, in the client's format, should they ever arrive (a
// future Go, another server in front). The body's strings are JSON and
// may hold anything. A value the worker forwards or stores must be
// refused here, in the client's wire format and before anything is
// leased, or made harmless.

const (
	// maxHeaderValue bounds one forwarded header value, maxForwardedHeaders
	// all of them: agents send a few hundred bytes (anthropic-beta is the
	// longest), and an upstream answering 431 to an oversized header would
	// do so after an account was leased for it.
	maxHeaderValue      = 8 << 10
	maxForwardedHeaders = 32 << 10
	// maxModelLen bounds the model name: it is stored with every lease and
	// route event, and real ids are well under 100 bytes.
	maxModelLen = 256
)

// checkHeaders refuses a request with more than one distinct client key,
// a header value with a control character, or forwarded headers over the
// bounds.
func checkHeaders(r *http.Request) *apiError {
	for k, vs := range r.Header {
		for _, v := range vs {
			if strings.ContainsFunc(v, func(c rune) bool { return c != '\t' && (c < 0x20 || c == 0x7f) }) {
				return errInvalidRequest("header " + strings.ToLower(k) + " holds a control character")
			}
		}
	}
	for _, k := range []string{"X-Api-Key", "Authorization"} {
		if vs := r.Header.Values(k); len(vs) > 1 {
			for _, v := range vs[1:] {
				if v != vs[0] {
					return errInvalidRequest("more than one " + strings.ToLower(k) + " header: send one weir key")
				}
			}
		}
	}
	conn := connectionListed(r.Header)
	total := 0
	for k, vs := range r.Header {
		if hopHeaders[k] || clientOnlyHeaders[k] || conn[k] {
			continue
		}
		for _, v := range vs {
			if len(v) > maxHeaderValue {
				return errInvalidRequest("header " + strings.ToLower(k) + " is longer than " + strconv.Itoa(maxHeaderValue) + " bytes")
			}
			total += len(k) + len(v)
		}
	}
	if total > maxForwardedHeaders {
		return errInvalidRequest("request headers total more than " + strconv.Itoa(maxForwardedHeaders) + " bytes")
	}
	return nil
}

// validModel refuses a model name no upstream serves and Postgres may not
// store (NUL): control characters, or an over-long name.
func validModel(m string) bool {
	return len(m) <= maxModelLen && !hasControl(m)
}

// hasControl says whether s holds an ASCII control character or DEL.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}
