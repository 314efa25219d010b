package dashboard

import (
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/quotamode"
)

// durationField is the form of one duration setting. ZeroWarning, when
// set, is asked before the setting is saved as 0 (a page with scripts
// asks in a dialog).
type durationField struct{ Name, Label, Help, ZeroWarning string }

// durationFields are the duration settings' forms, in page order.
var durationFields = []durationField{
	{"capacity_hold", "Capacity hold", "How long a request may wait for capacity when every account is cooling or busy; 0s disables holding. Up to 6h.",
		"With a capacity hold of 0, no request waits: every overload blip and every busy moment reaches the agents as an error, and a turn dies on the first one. Save 0 anyway?"},
	{"unreachable_hold", "Unreachable hold", "How long a request may wait while every account that could serve it is unreachable (refused, no such host, TLS, timeouts); then a 503 that names the cause. The capacity hold caps it. Up to 6h.",
		"With an unreachable hold of 0, a network blip between weir and a provider fails every request at once. Save 0 anyway?"},
	{"request_deadline", "Request deadline", "A request's whole budget from arrival to its first byte, holds included. 1m to 6h.", ""},
}

type settingsData struct {
	Durations []durationField
	// Values as the form shows them, and an error per field (the RPC's
	// validation message), keyed by setting name.
	Values  map[string]string
	Errors  map[string]string
	Saved   string
	Changes []*weirv1.SettingChange
	Aliases []*weirv1.Alias
	// AliasForm keeps what was typed when setting an alias failed.
	AliasName, AliasTargets, AliasError string
	Now                                 time.Time
}

// settingsData reads the settings, audit and aliases; values the operator
// typed (and the errors they drew) override what is stored.
func (h *Handler) settingsData(r *http.Request) (settingsData, error) {
	ctx := r.Context()
	st, err := h.cfg.Settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		return settingsData{}, err
	}
	changes, err := h.cfg.Settings.ListSettingChanges(ctx, connect.NewRequest(&weirv1.ListSettingChangesRequest{Limit: 50}))
	if err != nil {
		return settingsData{}, err
	}
	aliases, err := h.cfg.Aliases.ListAliases(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{}))
	if err != nil {
		return settingsData{}, err
	}
	s := st.Msg.Settings
	return settingsData{
		Durations: durationFields,
		Values: map[string]string{
			"capacity_hold":       s.GetCapacityHold().AsDuration().String(),
			"unreachable_hold":    s.GetUnreachableHold().AsDuration().String(),
			"request_deadline":    s.GetRequestDeadline().AsDuration().String(),
			"quota_response_mode": strings.ToLower(strings.TrimPrefix(s.QuotaResponseMode.String(), "QUOTA_RESPONSE_MODE_")),
		},
		Errors:  map[string]string{},
		Saved:   r.URL.Query().Get("saved"),
		Changes: changes.Msg.Changes,
		Aliases: aliases.Msg.Aliases,
		Now:     h.cfg.Now(),
	}, nil
}

func (h *Handler) settingsPage(w http.ResponseWriter, r *http.Request, s session) {
	d, err := h.settingsData(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "settings", view{Title: "Settings", Nav: "settings", CSRF: s.csrf, Role: s.role, Data: d})
}

// updateSetting changes one setting through SettingsService, which does
// all the validation; its message is shown next to the field.
func (h *Handler) updateSetting(w http.ResponseWriter, r *http.Request, s session) {
	name, value := r.PostFormValue("name"), strings.TrimSpace(r.PostFormValue("value"))
	st := &weirv1.Settings{}
	var inputErr string
	switch name {
	case "capacity_hold", "unreachable_hold", "request_deadline":
		d, err := time.ParseDuration(value)
		if err != nil {
			inputErr = "settings." + name + ": " + value + " is not a duration (write 20m, 90s or 1h30m)"
			break
		}
		switch name {
		case "capacity_hold":
			st.CapacityHold = durationpb.New(d)
		case "unreachable_hold":
			st.UnreachableHold = durationpb.New(d)
		default:
			st.RequestDeadline = durationpb.New(d)
		}
	case "quota_response_mode":
		m, ok := quotamode.Parse(value)
		if !ok {
			inputErr = "settings.quota_response_mode: want retryable or usage_limit"
		}
		st.QuotaResponseMode = m
	default:
		http.Error(w, "unknown setting", http.StatusBadRequest)
		return
	}
	var err error
	if inputErr == "" {
		_, err = h.cfg.Settings.UpdateSettings(r.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
			Settings: st, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{name}}}))
		if err == nil {
			h.cfg.Logger.InfoContext(r.Context(), "dashboard setting changed", "name", name)
			http.Redirect(w, r, Prefix+"settings?saved="+name, http.StatusSeeOther)
			return
		}
		inputErr = rpcMessage(err)
	}
	d, derr := h.settingsData(r)
	if derr != nil {
		h.fail(w, r, derr)
		return
	}
	d.Saved = ""
	d.Values[name] = value
	d.Errors[name] = inputErr
	h.render(w, r, http.StatusUnprocessableEntity, "settings", view{Title: "Settings", Nav: "settings", CSRF: s.csrf, Role: s.role, Data: d})
}

// setAlias creates or replaces an alias; targets are separated by commas
// or spaces.
func (h *Handler) setAlias(w http.ResponseWriter, r *http.Request, s session) {
	alias := strings.TrimSpace(r.PostFormValue("alias"))
	raw := r.PostFormValue("targets")
	targets := strings.FieldsFunc(raw, func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' })
	translate := r.PostFormValue("translate") != ""
	_, err := h.cfg.Aliases.SetAlias(r.Context(), connect.NewRequest(&weirv1.SetAliasRequest{Alias: alias, Targets: targets, Translate: translate}))
	if err == nil {
		http.Redirect(w, r, Prefix+"settings?saved=alias#aliases", http.StatusSeeOther)
		return
	}
	d, derr := h.settingsData(r)
	if derr != nil {
		h.fail(w, r, derr)
		return
	}
	d.Saved = ""
	d.AliasName, d.AliasTargets, d.AliasError = alias, raw, rpcMessage(err)
	h.render(w, r, http.StatusUnprocessableEntity, "settings", view{Title: "Settings", Nav: "settings", CSRF: s.csrf, Role: s.role, Data: d})
}

func (h *Handler) deleteAlias(w http.ResponseWriter, r *http.Request, s session) {
	_, err := h.cfg.Aliases.DeleteAlias(r.Context(), connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: r.PostFormValue("alias"), Key: r.PostFormValue("key")}))
	if err == nil {
		http.Redirect(w, r, Prefix+"settings?saved=alias#aliases", http.StatusSeeOther)
		return
	}
	d, derr := h.settingsData(r)
	if derr != nil {
		h.fail(w, r, derr)
		return
	}
	d.Saved = ""
	d.AliasError = rpcMessage(err)
	h.render(w, r, http.StatusUnprocessableEntity, "settings", view{Title: "Settings", Nav: "settings", CSRF: s.csrf, Role: s.role, Data: d})
}
