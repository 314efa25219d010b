package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/weirhq/weir/internal/clock"
)

// maxBodyBytes is the real API's request size limit.
const maxBodyBytes = 32 << 20

// Config configures a simulator.
type Config struct {
	// Logger receives one record per attempt and per control change.
	// Default: discard.
	Logger *slog.Logger
	// Now is the clock for rate-limit reset times, usage windows, token
	// and grant expiry, ids and attempt times. Default: time.Now.
	Now func() time.Time
	// ManualClock, when true, gives the simulator its own virtual time: it
	// starts at Now() and moves only through Server.Advance or POST
	// /_sim/clock. Latencies (DeltaDelay, slow_headers) stay real time.
	ManualClock bool
	// DeltaDelay is the pause between streamed content_block_delta events.
	// Default: 0.
	DeltaDelay time.Duration
	// Deltas is the number of text deltas per streamed reply. Default: 8.
	// A request's Sim-Stream header overrides it and DeltaDelay for that
	// request (see StreamHeader).
	Deltas int
	// Latency is a fixed real-time wait before every /v1/messages answer
	// (load tests: an upstream that takes time to think). Default: 0.
	Latency time.Duration
	// Script is the initial script. Default: no accounts, unknown
	// credentials refused.
	Script Script
}

// Validate reports every invalid field of the config.
func (c Config) Validate() error {
	var errs []error
	if c.DeltaDelay < 0 {
		errs = append(errs, fmt.Errorf("config: DeltaDelay %v is negative", c.DeltaDelay))
	}
	if c.Deltas < 0 {
		errs = append(errs, fmt.Errorf("config: Deltas %d is negative", c.Deltas))
	}
	if c.Latency < 0 {
		errs = append(errs, fmt.Errorf("config: Latency %v is negative", c.Latency))
	}
	if err := c.Script.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("config: Script: %w", err))
	}
	return errors.Join(errs...)
}

// Server is the simulated upstream. It is safe for concurrent use.
type Server struct {
	log        *slog.Logger
	now        func() time.Time
	clock      *clock.Manual // nil unless Config.ManualClock
	deltaDelay time.Duration
	latency    time.Duration
	reply      reply
	mux        *http.ServeMux
	attempts   attemptLog

	mu  sync.Mutex
	reg *registry
	// turns is each recent Responses answer's turn (its tool results so
	// far, and the tools its conversation's input items offered), for a
	// request that continues it by previous_response_id (Codex over its
	// WebSocket) and so sends only the items since.
	turns map[string]turn

	// onAttempt, when set before the server is used, is called after each
	// attempt is logged; tests wait on it instead of sleeping.
	onAttempt func(Attempt)
}

// New returns a simulator. It panics if cfg is invalid; check a script
// from user input with LoadScript or Script.Validate first.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic("sim: invalid config: " + err.Error())
	}
	s := &Server{
		log:        cfg.Logger,
		now:        cfg.Now,
		deltaDelay: cfg.DeltaDelay,
		latency:    cfg.Latency,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if cfg.ManualClock {
		s.clock = clock.NewManual(s.now())
		s.now = s.clock.Now
	}
	s.reg = newRegistryAt(cfg.Script, s.now())
	deltas := cfg.Deltas
	if deltas == 0 {
		deltas = 8
	}
	s.reply = newReply(deltas)

	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/messages", s.handleMessages)
	s.mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	s.mux.HandleFunc("GET /v1/models", s.handleModels)
	s.mux.HandleFunc("GET /api/oauth/usage", s.handleUsage)
	s.mux.HandleFunc("POST /v1/oauth/token", s.handleToken)
	s.mux.HandleFunc("GET /api/oauth/profile", s.handleProfile)
	s.mux.HandleFunc("GET /oauth/authorize", s.handleAuthorize)
	s.mux.HandleFunc("POST /api/organizations/{org}/reset_rate_limits", s.handleResetRateLimits)
	s.mux.HandleFunc("POST /backend-api/codex/responses", s.handleCodexResponses)
	s.mux.HandleFunc("POST /v1/responses", s.handleResponses)
	s.mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	s.mux.HandleFunc("GET /backend-api/wham/usage", s.handleWhamUsage)
	s.mux.HandleFunc("POST /oauth/token", s.handleOpenAIToken)
	s.mux.HandleFunc("/", s.handleNotFound)
	s.registerControl(s.mux)
	return s
}

// ServeHTTP serves the simulated API under /v1/ and the control API under
// /_sim/.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("request-id", newID("req_", s.now()))
	r, _ = tracked(r)
	// Also when a handler aborts (panic(http.ErrAbortHandler)): the
	// connection is closed after this.
	defer s.endAttempt(r)
	s.mux.ServeHTTP(w, r)
}

// exchange is one API request on its way through the simulator.
type exchange struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	body    []byte
	bodySHA string
	req     messagesRequest
	problem string    // why the body is not a valid messages request
	acct    *account  // nil until authenticated
	itemID  string    // the Responses output item's id, once made
	respID  string    // the Responses response's id, once made
	tool    *toolCall // the tool call answered instead of text; nil: text
	wire    toolWire  // the request's wire format
	counted *Usage    // the request's tokens, once counted (usage.go)
}

// identify adds what real upstreams send that names the account behind an
// answer: Anthropic's organization id, OpenAI's organization and project,
// the ChatGPT account id, and a load balancer's cookie. A gateway must not
// pass any of them on to its clients.
func identify(h http.Header, path string, acct *account) {
	h.Add("Set-Cookie", "__cf_bm=sim-"+acct.name+"; Path=/; HttpOnly")
	if strings.HasPrefix(path, "/v1/messages") {
		h.Set("anthropic-organization-id", "org-"+acct.name)
		return
	}
	h.Set("openai-organization", "org-"+acct.name)
	h.Set("openai-project", "proj_"+acct.name)
	h.Set("chatgpt-account-id", "acct-"+acct.name)
}

// admit reads the body and checks the credential and anthropic-version. When
// it returns false it has already answered and logged the attempt.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (*exchange, bool) {
	x := &exchange{s: s, w: w, r: r}
	if !x.readBody() {
		return nil, false
	}
	x.req, x.problem = parseMessagesRequest(x.body)

	ar := s.authenticate(r.Header)
	x.acct = ar.acct
	if ar.fail != "" {
		x.fail(ar.outcome, http.StatusUnauthorized, "authentication_error", ar.fail)
		return nil, false
	}
	if r.Header.Get("anthropic-version") == "" {
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", "anthropic-version: header is required")
		return nil, false
	}
	return x, true
}

// readBody reads the whole request body within the size limit.
func (x *exchange) readBody() bool {
	b, err := io.ReadAll(http.MaxBytesReader(x.w, x.r.Body, maxBodyBytes))
	sum := sha256.Sum256(b)
	x.body, x.bodySHA = b, hex.EncodeToString(sum[:])
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		x.fail(outcomeTooLarge, http.StatusRequestEntityTooLarge, "request_too_large", "Request exceeds the maximum allowed number of bytes.")
		return false
	case err != nil:
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", "Could not read the request body.")
		return false
	}
	return true
}

// record logs the attempt. It is called before the response is written, so
// that a client which has seen a response also finds its attempt logged.
func (x *exchange) record(outcome string, status int) {
	a := Attempt{
		Time:       x.s.now(),
		Model:      x.req.Model,
		Path:       x.r.URL.Path,
		Stream:     x.req.Stream,
		BodySHA256: x.bodySHA,
		Outcome:    outcome,
		Status:     status,
	}
	if x.acct != nil {
		a.Account = x.acct.name
		identify(x.w.Header(), x.r.URL.Path, x.acct)
	}
	x.logAttempt(a)
	level := slog.LevelInfo
	if outcome == outcomeOK {
		level = slog.LevelDebug
	}
	x.s.log.LogAttrs(x.r.Context(), level, "sim attempt",
		slog.String("request_id", x.w.Header().Get("request-id")),
		slog.String("account", a.Account),
		slog.String("model", a.Model),
		slog.String("path", a.Path),
		slog.Bool("stream", a.Stream),
		slog.String("outcome", outcome),
		slog.Int("status", status),
	)
	if x.s.onAttempt != nil {
		x.s.onAttempt(a)
	}
}

// handleNotFound answers any path the real API does not have.
func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	x := &exchange{s: s, w: w, r: r}
	if x.readBody() {
		x.fail(outcomeNotFound, http.StatusNotFound, "not_found_error", "Not Found")
	}
}
