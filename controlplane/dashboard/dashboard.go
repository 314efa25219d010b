// Package dashboard is the operator dashboard the control plane serves at
// /dashboard/: server-rendered pages over the control plane's Connect
// services (called in process), sign-in with the admin token or OpenID
// Connect into a server-side session, a role per page and action, inline
// SVG charts and a little vanilla JavaScript for live refresh and
// countdowns. It loads nothing from the network.
package dashboard

import (
	"bytes"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane/people"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// Prefix is where the dashboard is mounted; JobsPrefix is River's UI.
const (
	Prefix     = "/dashboard/"
	JobsPrefix = "/dashboard/jobs"
)

// refreshEvery is how often the live pages fetch their fragment.
const refreshEvery = 5 * time.Second

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Config is what the dashboard is built from.
type Config struct {
	// AdminToken is the operator's token: the login compares against it and
	// keys the session and CSRF MACs. Required.
	AdminToken string
	// Sessions stores the sessions. Required.
	Sessions SessionStore
	// OIDC is the OpenID provider people sign in with; nil offers the
	// admin token only.
	OIDC *OIDC
	// Roles maps a signed-in person's email to their role.
	Roles people.Mapping
	// TrustedProxies are the proxies whose X-Forwarded-Proto and
	// X-Forwarded-For are believed (trust.go).
	TrustedProxies []netip.Prefix
	// The control plane's services; in process, their handlers.
	Accounts  weirv1connect.AccountServiceClient
	Keys      weirv1connect.KeyServiceClient
	Routes    weirv1connect.RouteServiceClient
	Settings  weirv1connect.SettingsServiceClient
	Aliases   weirv1connect.AliasServiceClient
	Dashboard weirv1connect.DashboardServiceClient
	Audit     weirv1connect.AuditServiceClient
	Usage     weirv1connect.UsageServiceClient
	Ops       weirv1connect.OpsServiceClient
	// Jobs serves River's UI under JobsPrefix; nil when this replica runs
	// no jobs (the jobs page then says so).
	Jobs http.Handler
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// Handler serves the dashboard.
type Handler struct {
	cfg      Config
	mux      *http.ServeMux
	pages    map[string]*template.Template
	failures *failures
}

// New builds the dashboard. Templates are parsed here: a broken template
// fails at start, not on a page view.
func New(cfg Config) *Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), pages: map[string]*template.Template{}, failures: newFailures(cfg.Now, cfg.Logger)}
	for _, page := range []string{"login", "accounts", "account", "confirm", "history", "requests", "explain", "settings", "audit", "jobs",
		"usage", "cache", "prices", "budgets"} {
		h.pages[page] = template.Must(template.New("layout.html").Funcs(h.funcs()).
			ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html"))
	}
	h.pages["continue"] = template.Must(template.ParseFS(templateFS, "templates/continue.html"))
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // embedded at build time
	}
	h.mux.Handle("GET /dashboard/static/", http.StripPrefix("/dashboard/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET /dashboard/login", h.loginPage)
	h.mux.HandleFunc("POST /dashboard/login", h.login)
	if cfg.OIDC != nil {
		h.mux.HandleFunc("GET /dashboard/oidc/start", h.oidcStart)
		h.mux.HandleFunc("GET /dashboard/oidc/callback", h.oidcCallback)
	}
	// Each page and action names the role it needs: reads the viewer's,
	// account actions the operator's, settings and aliases the admin's (the
	// same roles the services check again, roles.go in the control plane).
	viewer := func(f func(http.ResponseWriter, *http.Request, session)) http.HandlerFunc {
		return h.authed(people.Viewer, f)
	}
	h.mux.HandleFunc("POST /dashboard/logout", viewer(h.logout))
	h.mux.HandleFunc("GET /dashboard/{$}", viewer(h.accountsPage))
	h.mux.HandleFunc("GET /dashboard/fragment/accounts", viewer(h.accountsFragment))
	h.mux.HandleFunc("GET /dashboard/accounts/{id}", viewer(h.accountPage))
	h.mux.HandleFunc("GET /dashboard/accounts/{id}/{action}", h.authed(people.Operator, h.confirmPage))
	h.mux.HandleFunc("POST /dashboard/accounts/{id}/{action}", h.authed(people.Operator, h.accountAction))
	h.mux.HandleFunc("GET /dashboard/history", viewer(h.historyPage))
	h.mux.HandleFunc("GET /dashboard/requests", viewer(h.requestsPage))
	h.mux.HandleFunc("GET /dashboard/fragment/requests", viewer(h.requestsFragment))
	h.mux.HandleFunc("GET /dashboard/requests/{id}", viewer(h.explainPage))
	h.mux.HandleFunc("GET /dashboard/usage", viewer(h.usagePage))
	h.mux.HandleFunc("GET /dashboard/usage.csv", viewer(h.usageCSV))
	h.mux.HandleFunc("GET /dashboard/usage/cache", viewer(h.cachePage))
	h.mux.HandleFunc("GET /dashboard/usage/prices", viewer(h.pricesPage))
	h.mux.HandleFunc("GET /dashboard/budgets", viewer(h.budgetsPage))
	h.mux.HandleFunc("GET /dashboard/settings", viewer(h.settingsPage))
	h.mux.HandleFunc("POST /dashboard/settings", h.authed(people.Admin, h.updateSetting))
	h.mux.HandleFunc("POST /dashboard/aliases", h.authed(people.Admin, h.setAlias))
	h.mux.HandleFunc("POST /dashboard/aliases/delete", h.authed(people.Admin, h.deleteAlias))
	h.mux.HandleFunc("GET /dashboard/audit", viewer(h.auditPage))
	h.mux.HandleFunc("GET /dashboard/jobs", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, JobsPrefix+"/", http.StatusMovedPermanently)
	})
	h.mux.HandleFunc(JobsPrefix+"/", viewer(h.jobs))
	return h
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	if h.secure(r) {
		w.Header().Set("Strict-Transport-Security", "max-age=31536000")
	}
	h.mux.ServeHTTP(w, r)
}

// view is what every page template gets.
type view struct {
	Title string
	// Nav is the page's entry in the navigation.
	Nav  string
	CSRF string
	// Role decides which actions the page offers.
	Role people.Role
	// Data is the page's own.
	Data any
}

// CanOperate and CanAdminister say whether to show the operator's and
// the admin's buttons; the handlers refuse them all the same.
func (v view) CanOperate() bool    { return v.Role >= people.Operator }
func (v view) CanAdminister() bool { return v.Role >= people.Admin }

// render writes a page with status.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, page string, v view) {
	h.execute(w, r, status, page, "layout.html", v)
}

// execute writes one template of a page: the whole layout or a fragment.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, status int, page, name string, v any) {
	var buf bytes.Buffer
	if err := h.pages[page].ExecuteTemplate(&buf, name, v); err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "dashboard template failed", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Scripts and styles come from /dashboard/static only; inline styles
	// are allowed (html/template escapes them), inline scripts are not.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	w.WriteHeader(status)
	w.Write(buf.Bytes()) //nolint:errcheck // the client went away
}

// rpcMessage is what an operator may read of a failed call: the message of
// an invalid argument, not found or conflict, else a generic line (the
// control plane logged the detail).
func rpcMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
			return ce.Message()
		}
	}
	return "the control plane could not do that; see its log"
}

// fail answers a page whose data could not be read.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusInternalServerError
	if connect.CodeOf(err) == connect.CodeNotFound {
		status = http.StatusNotFound
	} else if connect.CodeOf(err) == connect.CodeInvalidArgument {
		status = http.StatusBadRequest
	}
	http.Error(w, rpcMessage(err), status)
}

func (h *Handler) jobs(w http.ResponseWriter, r *http.Request, s session) {
	if h.cfg.Jobs == nil {
		h.render(w, r, http.StatusOK, "jobs", view{Title: "Jobs", Nav: "jobs", CSRF: s.csrf, Role: s.role})
		return
	}
	// River's UI changes jobs (cancel, retry, delete): the admin's.
	if !safeMethod(r.Method) && s.role < people.Admin {
		http.Error(w, "your role ("+s.role.String()+") may not do this; it needs admin", http.StatusForbidden)
		return
	}
	// River's UI posts with its own JavaScript, which cannot send our CSRF
	// field; a cookie session's unsafe requests must come from this origin.
	if s.cookie && !safeMethod(r.Method) && !sameOrigin(r) {
		http.Error(w, "cross-origin request refused", http.StatusForbidden)
		return
	}
	h.cfg.Jobs.ServeHTTP(w, r)
}
