package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/poolstatus"
)

const accountsUsage = `Usage:
  weir accounts add --label L [--provider anthropic|openai|codex] [--auth api_key|oauth] (--secret-stdin | --secret-file F)
      [--base-url U] [--max-concurrency N] [--priority N] [--upstream-account-id ID] [--proxy URL|direct]
      an OAuth secret is an access token, or JSON with a refresh token that weir keeps fresh:
      --secret-file ~/.claude/.credentials.json, or {"access_token","refresh_token","expires_at"};
      a codex account (a ChatGPT login) takes --secret-file ~/.codex/auth.json, which names its account
  weir accounts import [--label-prefix P] [--dry-run] FILE...   (- reads standard input)
      recognises ~/.claude/.credentials.json, a 'claude setup-token' token, ~/.codex/auth.json,
      and Anthropic or OpenAI API keys; a credential already in the pool is reported, not added
  weir accounts list
  weir accounts get ID|LABEL
  weir accounts pause ID|LABEL
  weir accounts resume ID|LABEL
  weir accounts rm ID|LABEL
  weir accounts set ID|LABEL [--label L] [--base-url U] [--max-concurrency N] [--priority N] [--secret-stdin | --secret-file F]
      [--banked-resets=on|off] [--org ORG] [--upstream-account-id ID] [--proxy URL|direct|""]
      [--owner key:NAME|team:NAME|none]   (also: weir accounts update)
      --proxy: the account's egress proxy, http://, https://, socks5:// or socks5h://[user:pass@]host:port;
      direct bypasses the default (weir settings set egress_proxy=URL); "" follows it
      --owner: keep an OAuth subscription (a seat) for one key, or for every key of a team;
      weir settings set owned_accounts=owners_only makes it theirs alone (default shared: theirs first)
  weir accounts grants ID|LABEL     list an OAuth account's banked-reset grants and claims
  weir accounts claim-grant ID|LABEL GRANT   claim a grant now (at most one claim an hour)
  weir accounts usage ID|LABEL      read an OAuth account's usage now, if its read budget allows
Every command takes --json, --controlplane and --data-dir.
`

func runAccounts(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, accountsUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir accounts "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	switch sub {
	case "add":
		return accountsAdd(ctx, fs, &af, args, e)
	case "import":
		return accountsImport(ctx, fs, &af, args, e)
	case "set", "update":
		return accountsSet(ctx, fs, &af, args, e)
	case "usage":
		return accountsRefreshUsage(ctx, fs, &af, args, e)
	case "grants":
		return accountsGrants(ctx, fs, &af, args, e)
	case "claim-grant":
		return accountsClaimGrant(ctx, fs, &af, args, e)
	case "list", "ls":
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
		if err != nil {
			return rpcError("list accounts", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		printAccounts(e.stdout, resp.Msg.Accounts, time.Now())
		return nil
	case "get", "pause", "resume", "rm", "delete":
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		var acct *weirv1.Account
		switch sub {
		case "get":
			r, err := c.accounts.GetAccount(ctx, connect.NewRequest(&weirv1.GetAccountRequest{Id: ref}))
			if err != nil {
				return rpcError("get account", err)
			}
			acct = r.Msg.Account
		case "pause":
			r, err := c.accounts.PauseAccount(ctx, connect.NewRequest(&weirv1.PauseAccountRequest{Id: ref}))
			if err != nil {
				return rpcError("pause account", err)
			}
			acct = r.Msg.Account
		case "resume":
			r, err := c.accounts.ResumeAccount(ctx, connect.NewRequest(&weirv1.ResumeAccountRequest{Id: ref}))
			if err != nil {
				return rpcError("resume account", err)
			}
			acct = r.Msg.Account
		default:
			if _, err := c.accounts.DeleteAccount(ctx, connect.NewRequest(&weirv1.DeleteAccountRequest{Id: ref})); err != nil {
				return rpcError("delete account", err)
			}
			if af.json {
				return printJSON(e.stdout, &weirv1.DeleteAccountResponse{})
			}
			fmt.Fprintf(e.stdout, "deleted %s\n", ref)
			return nil
		}
		if af.json {
			return printJSON(e.stdout, acct)
		}
		printAccounts(e.stdout, []*weirv1.Account{acct}, time.Now())
		if sub == "get" {
			printIdentity(e.stdout, acct)
			printEgress(e.stdout, acct)
			printOwner(e.stdout, acct)
			printForecasts(e.stdout, acct, time.Now())
		}
		return nil
	}
	fmt.Fprintf(e.stderr, "weir accounts: unknown subcommand %q\n\n%s", sub, accountsUsage)
	return errUsageShown
}

// parseWithRef parses flags around one positional ID|LABEL argument.
func parseWithRef(fs *flag.FlagSet, args []string) (string, error) {
	pos, err := parsePositional(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", fmt.Errorf("%s: want exactly one ID or LABEL", fs.Name())
	}
	return pos[0], nil
}

// parsePositional parses flags placed before, between or after the
// positional arguments, which it returns in order.
func parsePositional(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

type secretFlags struct {
	stdin bool
	file  string
}

func (s *secretFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&s.stdin, "secret-stdin", false, "read the credential from standard input")
	fs.StringVar(&s.file, "secret-file", "", "read the credential from this file")
}

func (s *secretFlags) given() bool { return s.stdin || s.file != "" }

// read returns the credential. It is never a flag value: flags end up in
// shell history and process listings.
func (s *secretFlags) read(stdin io.Reader) (string, error) {
	var raw []byte
	var err error
	switch {
	case s.stdin && s.file != "":
		return "", errors.New("use one of --secret-stdin and --secret-file")
	case s.stdin:
		raw, err = io.ReadAll(io.LimitReader(bufio.NewReader(stdin), 64<<10))
	case s.file != "":
		raw, err = os.ReadFile(s.file)
	default:
		return "", errors.New("the credential is required: pipe it with --secret-stdin or name a file with --secret-file")
	}
	if err != nil {
		return "", fmt.Errorf("read credential: %w", err)
	}
	secret := strings.TrimSpace(string(raw))
	if secret == "" {
		return "", errors.New("the credential is empty")
	}
	return secret, nil
}

func accountsAdd(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	var (
		label, auth, baseURL     string
		providerName, upstreamID string
		proxy                    string
		maxConc, priority        int
		sf                       secretFlags
	)
	fs.StringVar(&label, "label", "", "a unique name for the account (required)")
	fs.StringVar(&providerName, "provider", "anthropic", "anthropic, openai (API keys, OpenAI-compatible endpoints) or codex (ChatGPT logins)")
	fs.StringVar(&auth, "auth", "", "api_key or oauth (default: openai api_key, codex oauth, anthropic guessed from the credential)")
	fs.StringVar(&baseURL, "base-url", "", "upstream base URL override (default: anthropic https://api.anthropic.com, openai https://api.openai.com/v1, codex https://chatgpt.com/backend-api)")
	fs.StringVar(&upstreamID, "upstream-account-id", "", "codex: the ChatGPT account id (default: from the auth.json)")
	fs.IntVar(&maxConc, "max-concurrency", 0, "concurrent requests on this account (default 4)")
	fs.IntVar(&priority, "priority", 0, "higher is preferred")
	fs.StringVar(&proxy, "proxy", "", proxyHelp)
	sf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir accounts add: unexpected argument %q (the credential is never an argument; use --secret-stdin)", fs.Arg(0))
	}
	if label == "" {
		return errors.New("weir accounts add: --label is required")
	}
	provider, err := parseProvider(providerName)
	if err != nil {
		return err
	}
	secret, err := sf.read(e.stdin)
	if err != nil {
		return fmt.Errorf("weir accounts add: %w", err)
	}
	kind, err := authKind(auth, provider, secret)
	if err != nil {
		return err
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	resp, err := c.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider:          provider,
		AuthKind:          kind,
		Label:             label,
		Credential:        secret,
		BaseUrl:           baseURL,
		MaxConcurrency:    int32(maxConc),
		Priority:          int32(priority),
		UpstreamAccountId: upstreamID,
		EgressProxy:       proxy,
	}))
	if err != nil {
		return rpcError("add account", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg.Account)
	}
	printAccounts(e.stdout, []*weirv1.Account{resp.Msg.Account}, time.Now())
	return nil
}

func accountsSet(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	var (
		label, baseURL, upstreamID string
		proxy, owner               string
		maxConc, priority          int
		sf                         secretFlags
	)
	fs.StringVar(&label, "label", "", "new label")
	fs.StringVar(&owner, "owner", "", "key:NAME or team:NAME to keep this OAuth subscription for a key or a team, none for no owner")
	fs.StringVar(&proxy, "proxy", "", proxyHelp+`; "" follows the default`)
	fs.StringVar(&upstreamID, "upstream-account-id", "", "codex: the ChatGPT account id")
	fs.StringVar(&baseURL, "base-url", "", "new upstream base URL")
	fs.IntVar(&maxConc, "max-concurrency", 0, "new concurrency cap")
	fs.IntVar(&priority, "priority", 0, "new priority")
	sf.register(fs)
	var bf bankedFlags
	bf.register(fs)
	ref, err := parseWithRef(fs, args)
	if err != nil {
		return err
	}
	req := &weirv1.UpdateAccountRequest{Id: ref, UpdateMask: &fieldmaskpb.FieldMask{}}
	var ownerErr error
	fs.Visit(func(f *flag.Flag) {
		bf.apply(f.Name, req)
		switch f.Name {
		case "label":
			req.Label = label
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "label")
		case "base-url":
			req.BaseUrl = baseURL
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "base_url")
		case "max-concurrency":
			req.MaxConcurrency = int32(maxConc)
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "max_concurrency")
		case "priority":
			req.Priority = int32(priority)
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "priority")
		case "upstream-account-id":
			req.UpstreamAccountId = upstreamID
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "upstream_account_id")
		case "proxy":
			req.EgressProxy = proxy
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "egress_proxy")
		case "owner":
			req.Owner, ownerErr = parseOwner(owner)
			req.UpdateMask.Paths = append(req.UpdateMask.Paths, "owner")
		}
	})
	if ownerErr != nil {
		return fmt.Errorf("weir accounts set: %w", ownerErr)
	}
	if sf.given() {
		secret, err := sf.read(e.stdin)
		if err != nil {
			return fmt.Errorf("weir accounts set: %w", err)
		}
		req.Credential = secret
		req.UpdateMask.Paths = append(req.UpdateMask.Paths, "credential")
	}
	if len(req.UpdateMask.Paths) == 0 {
		return errors.New("weir accounts set: name something to change")
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	resp, err := c.accounts.UpdateAccount(ctx, connect.NewRequest(req))
	if err != nil {
		return rpcError("update account", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg.Account)
	}
	printAccounts(e.stdout, []*weirv1.Account{resp.Msg.Account}, time.Now())
	return nil
}

// parseOwner reads --owner: key:NAME, team:NAME (a name or an id), or
// none (nil: no owner).
func parseOwner(v string) (*weirv1.AccountOwner, error) {
	if v == "none" {
		return nil, nil
	}
	kind, name, ok := strings.Cut(v, ":")
	if ok && name != "" {
		switch kind {
		case "key":
			return &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_KEY, Name: name}, nil
		case "team":
			return &weirv1.AccountOwner{Kind: weirv1.OwnerKind_OWNER_KIND_TEAM, Name: name}, nil
		}
	}
	return nil, fmt.Errorf("--owner %q: want key:NAME, team:NAME or none", v)
}

// parseProvider reads --provider.
func parseProvider(name string) (weirv1.Provider, error) {
	switch strings.ToLower(name) {
	case "anthropic", "":
		return weirv1.Provider_PROVIDER_ANTHROPIC, nil
	case "openai":
		return weirv1.Provider_PROVIDER_OPENAI, nil
	case "codex", "chatgpt":
		return weirv1.Provider_PROVIDER_CODEX, nil
	}
	return 0, fmt.Errorf("--provider %q: want anthropic, openai or codex", name)
}

// authKind takes --auth, else the provider's only kind (openai: api_key,
// codex: oauth), else recognises Anthropic's OAuth token prefix or a JSON
// credential (access and refresh token, e.g. Claude Code's
// ~/.claude/.credentials.json), which only OAuth accounts have.
func authKind(flagValue string, provider weirv1.Provider, secret string) (weirv1.AuthKind, error) {
	switch flagValue {
	case "api_key", "api-key", "apikey":
		return weirv1.AuthKind_AUTH_KIND_API_KEY, nil
	case "oauth":
		return weirv1.AuthKind_AUTH_KIND_OAUTH, nil
	case "":
		switch provider {
		case weirv1.Provider_PROVIDER_OPENAI:
			return weirv1.AuthKind_AUTH_KIND_API_KEY, nil
		case weirv1.Provider_PROVIDER_CODEX:
			return weirv1.AuthKind_AUTH_KIND_OAUTH, nil
		}
		if strings.HasPrefix(secret, "sk-ant-oat") || strings.HasPrefix(secret, "{") {
			return weirv1.AuthKind_AUTH_KIND_OAUTH, nil
		}
		return weirv1.AuthKind_AUTH_KIND_API_KEY, nil
	}
	return 0, fmt.Errorf("--auth %q: want api_key or oauth", flagValue)
}

func printAccounts(w io.Writer, accts []*weirv1.Account, now time.Time) {
	tw := table(w)
	fmt.Fprintln(tw, "LABEL\tPROVIDER\tAUTH\tCREDENTIAL\tSTATE\t5H\t7D\tCHECK\tIN FLIGHT\tLAST SUCCESS\tOWNER\tID")
	for _, a := range accts {
		state := shortEnum(a.State.String(), "ACCOUNT_STATE_")
		var notes []string
		if a.Cooldown != nil {
			notes = append(notes, fmt.Sprintf("%s, until %s",
				shortEnum(a.Cooldown.Reason.String(), "COOLDOWN_REASON_"), until(a.Cooldown.Until, now)))
		}
		for _, g := range a.FamilyGates {
			// The account serves every other model family meanwhile.
			notes = append(notes, fmt.Sprintf("%s gated until %s", g.Family, until(g.Until, now)))
		}
		switch {
		case a.State == weirv1.AccountState_ACCOUNT_STATE_BROKEN:
			state += ": " + a.BrokenReason
		case len(notes) > 0:
			state = fmt.Sprintf("%s (%s)", state, strings.Join(notes, "; "))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", a.Label, shortEnum(a.Provider.String(), "PROVIDER_"), shortEnum(a.AuthKind.String(), "AUTH_KIND_"),
			a.CredentialHint, state, usageCell(a, "five_hour", now), usageCell(a, "seven_day", now), checkCell(a),
			a.InFlight, a.MaxConcurrency, ago(a.LastSuccessAt, now), poolstatus.OwnerText(a.Owner), a.Id)
	}
	tw.Flush()
}

// checkCell is what the check made when the account was added found:
// good, broken (the reason is the state's), or unverified and why.
func checkCell(a *weirv1.Account) string {
	c := shortEnum(a.Check.String(), "ACCOUNT_CHECK_")
	if a.Check == weirv1.AccountCheck_ACCOUNT_CHECK_UNVERIFIED && a.CheckReason != "" {
		c += ": " + a.CheckReason
	}
	return c
}

// usageCell renders one usage window as "45% ↺3h": the share used and the
// time until it resets. "-" when there is no evidence, or the reading is of
// a window that has reset since.
func usageCell(a *weirv1.Account, window string, now time.Time) string {
	for _, w := range a.Usage {
		if w.Window != window || w.Utilization == nil {
			continue
		}
		if w.ResetsAt == nil {
			return fmt.Sprintf("%.0f%%", *w.Utilization*100)
		}
		left := w.ResetsAt.AsTime().Sub(now)
		if left <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%% ↺%s", *w.Utilization*100, resetIn(left))
	}
	return "-"
}

// resetIn renders a time to reset in its largest unit: "4d", "3h", "12m",
// "<1m".
func resetIn(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	case d >= time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	case d >= time.Minute:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	}
	return "<1m"
}

func accountsRefreshUsage(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	ref, c, err := af.refClients(fs, args)
	if err != nil {
		return err
	}
	resp, err := c.accounts.RefreshUsage(ctx, connect.NewRequest(&weirv1.RefreshUsageRequest{Id: ref}))
	if err != nil {
		return rpcError("refresh usage", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	printUsage(e.stdout, resp.Msg, time.Now())
	return nil
}

// printUsage says whether the read happened and shows every window.
func printUsage(w io.Writer, r *weirv1.RefreshUsageResponse, now time.Time) {
	next := r.NextReadAllowedAt.AsTime().Local().Format(time.DateTime)
	switch {
	case !r.Read:
		fmt.Fprintf(w, "not read: the next read is allowed at %s (%s)\n", next, until(r.NextReadAllowedAt, now))
	case r.Error != "":
		fmt.Fprintf(w, "read failed: %s; the next read is allowed at %s (%s)\n", r.Error, next, until(r.NextReadAllowedAt, now))
	default:
		fmt.Fprintf(w, "read now; the next read is allowed at %s\n", next)
	}
	a := r.Account
	fmt.Fprintf(w, "%s, usage read %s\n", a.GetLabel(), ago(a.GetUsageReadAt(), now))
	tw := table(w)
	fmt.Fprintln(tw, "WINDOW\tUSED\tRESETS\tSOURCE\tOBSERVED")
	for _, u := range a.GetUsage() {
		used := "-"
		if u.Utilization != nil {
			used = fmt.Sprintf("%.1f%%", *u.Utilization*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", u.Window, used, until(u.ResetsAt, now), u.Source, ago(u.ObservedAt, now))
	}
	tw.Flush()
}

// proxyHelp is --proxy's.
const proxyHelp = "the account's egress proxy: http://, https://, socks5:// or socks5h://[user:pass@]host:port, " +
	"or direct to bypass the default (weir settings set egress_proxy=URL); sealed like the credential, shown as scheme://host:port"

// printEgress says what the account's traffic goes through (`weir
// accounts get`): its proxy by scheme://host:port, never its credentials.
func printEgress(w io.Writer, a *weirv1.Account) {
	var line string
	switch {
	case a.EgressProxy == "direct":
		line = "direct (bypasses the default)"
	case a.EgressProxy != "":
		line = a.EgressProxy
	case a.EgressVia != "":
		line = a.EgressVia + " (the default)"
	default:
		line = "direct"
	}
	fmt.Fprintf(w, "egress: %s\n", line)
}

// printOwner says whose seat the account is (`weir accounts get`).
func printOwner(w io.Writer, a *weirv1.Account) {
	line := "none (serves every key)"
	if o := a.Owner; o != nil {
		line = poolstatus.OwnerText(o)
		if o.Kind == weirv1.OwnerKind_OWNER_KIND_TEAM {
			line += " (every key of the team)"
		}
	}
	fmt.Fprintf(w, "owner: %s\n", line)
}

// printIdentity says which upstream account an account is (`weir accounts
// get`): its identity is not a secret, and a hash identity is only a
// prefix of one.
func printIdentity(w io.Writer, a *weirv1.Account) {
	id := a.Identity
	if id == "" {
		id = "- (not known yet: added before identities)"
	}
	fmt.Fprintf(w, "identity: %s\n", id)
}
