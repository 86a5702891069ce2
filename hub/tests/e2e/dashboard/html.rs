//! The dashboard's pages over real HTTPS against `trainhub dev` (no
//! spokes: the TrainJobs stay Pending, so filters and pages are stable):
//! login, security headers, CSRF, a tenant refused another namespace
//! without a trace of its data, filters and paging, escaping, the live
//! table's events, and its stream counted under the caller's caps.

use std::time::Duration;

use http_body_util::BodyExt as _;

use super::{ADMIN, ALICE, Http, csrf_of, tenants, trainjob_yaml};

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_authenticate_authorize_filter_escape_and_refuse_forged_actions() {
    let hub = tenants(&[
        "--spokes",
        "0",
        "--dashboard-trace-url",
        "https://jaeger.example/trace/{traceId}",
        // One stream per user: the live table's is counted as a watch.
        "--max-long-running-requests-per-user",
        "1",
        // One request at a time per user: an action's page hands its place
        // to the API request it makes (else every action would be 429).
        "--max-requests-inflight-per-user",
        "1",
    ]);
    let http = Http::new(&hub);

    // Five TrainJobs of alice's team-a (two labelled tier=gold), one of
    // team-b that alice must never see, one with a hostile annotation.
    let mut yaml = String::new();
    for i in 0..5 {
        let labels: &[(&str, &str)] = if i < 2 { &[("tier", "gold")] } else { &[] };
        yaml.push_str(&trainjob_yaml(
            "team-a",
            &format!("a-{i}"),
            labels,
            "print(1)",
        ));
        yaml.push_str("---\n");
    }
    yaml.push_str(&trainjob_yaml(
        "team-b",
        "secret-b",
        &[("tier", "hidden-b-label")],
        "print(1)",
    ));
    yaml.push_str("---\n");
    let hostile = trainjob_yaml("team-a", "hostile", &[], "print(1)").replacen(
        "  namespace: team-a\n",
        "  namespace: team-a\n  annotations:\n    trainhub.kubeflow.org/trace-id: \"<script>alert(1)</script>\"\n",
        1,
    );
    yaml.push_str(&hostile);
    yaml.push_str("---\n");
    yaml.push_str(
        &trainjob_yaml("team-a", "traced", &[], "print(1)").replacen(
            "  namespace: team-a\n",
            "  namespace: team-a\n  annotations:\n    trainhub.kubeflow.org/trace-id: 4bf92f3577b34da6a3ce929d0e0e4736\n",
            1,
        ),
    );
    hub.kubectl_stdin(&["apply", "-f", "-"], Some(&yaml));
    let out = hub.kubectl_ok(&["get", "trainjobs", "-A", "-o", "name"]);
    assert_eq!(out.lines().count(), 8, "{out}");
    let secret_uid = hub.kubectl_ok(&[
        "get",
        "trainjob",
        "secret-b",
        "-n",
        "team-b",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);

    // Not logged in: the login form, with the security headers.
    let answer = http.get("/dashboard/trainjobs", "").await;
    assert_eq!(answer.status, 303);
    assert_eq!(answer.header("location"), "/dashboard/login");
    assert_eq!(answer.header("content-security-policy"), CSP);
    let login = http.get("/dashboard/login", "").await;
    assert_eq!(login.status, 200);
    assert_eq!(login.header("content-security-policy"), CSP);
    assert_eq!(login.header("x-content-type-options"), "nosniff");
    assert_eq!(login.header("referrer-policy"), "no-referrer");
    assert!(!login.body.contains("<script>"), "no inline script");
    assert!(!login.body.contains("style="), "no inline style");

    // A wrong token is refused; a right one gets the session cookie.
    let wrong = http
        .post_form("/dashboard/login", &[], "token=not-a-token")
        .await;
    assert_eq!(wrong.status, 401);
    assert!(
        wrong.body.contains("does not accept this token"),
        "{}",
        wrong.body
    );
    assert!(wrong.header("set-cookie").is_empty());
    let answer = http
        .post_form("/dashboard/login", &[], &format!("token={ALICE}"))
        .await;
    assert_eq!(answer.status, 303);
    let set_cookie = answer.header("set-cookie");
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/dashboard"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    // The value is the token, hex-encoded (any token fits a cookie).
    let alice = set_cookie.split(';').next().unwrap().to_string();
    assert_eq!(alice, format!("trainhub_dashboard={}", hex::encode(ALICE)));

    // alice's table: her namespace only.
    let page = http.get("/dashboard/trainjobs", &alice).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("tj/team-a/a-0"), "{}", page.body);
    assert!(page.body.contains("7 TrainJobs"), "{}", page.body);
    assert!(!page.body.contains("secret-b"), "{}", page.body);

    // Another namespace: the API's 403, nothing of its objects.
    for path in [
        "/dashboard/trainjobs?namespace=team-b",
        "/dashboard/trainjobs/team-b/secret-b",
        "/dashboard/trainjobs/team-b/secret-b/delete",
    ] {
        let refused = http.get(path, &alice).await;
        assert_eq!(refused.status, 403, "{path}: {}", refused.body);
        assert!(
            refused.body.contains("User &quot;alice&quot; cannot")
                || refused.body.contains("User \"alice\" cannot"),
            "{path}: {}",
            refused.body
        );
        assert!(refused.body.contains("team-b"), "{}", refused.body);
        assert!(
            !refused.body.contains(&secret_uid),
            "{path}: {}",
            refused.body
        );
        assert!(
            !refused.body.contains("hidden-b-label"),
            "{path}: {}",
            refused.body
        );
        assert_eq!(refused.header("content-security-policy"), CSP);
    }
    // The admin sees both.
    let admin = http.login(ADMIN).await;
    let page = http.get("/dashboard/trainjobs", &admin).await;
    assert!(page.body.contains("8 TrainJobs"), "{}", page.body);
    assert!(page.body.contains("tj/team-b/secret-b"), "{}", page.body);

    // Filters and paging, on the server.
    let page = http
        .get(
            "/dashboard/trainjobs?prefix=a-&size=2&sort=name&order=asc",
            &alice,
        )
        .await;
    assert!(
        page.body.contains("5 TrainJobs · page 1 of 3"),
        "{}",
        page.body
    );
    assert!(page.body.contains("tj/team-a/a-0") && page.body.contains("tj/team-a/a-1"));
    assert!(!page.body.contains("tj/team-a/a-2"), "{}", page.body);
    assert!(page.body.contains("rel=\"next\""), "{}", page.body);
    let last = http
        .get(
            "/dashboard/trainjobs?prefix=a-&size=2&sort=name&order=asc&page=3",
            &alice,
        )
        .await;
    assert!(last.body.contains("tj/team-a/a-4"), "{}", last.body);
    assert!(!last.body.contains("tj/team-a/a-3") && !last.body.contains("rel=\"next\""));
    let gold = http
        .get("/dashboard/trainjobs?label=tier%3Dgold", &alice)
        .await;
    assert!(gold.body.contains("2 TrainJobs"), "{}", gold.body);
    let pending = http
        .get(
            "/dashboard/trainjobs?state=Pending&namespace=team-a",
            &alice,
        )
        .await;
    assert!(pending.body.contains("7 TrainJobs"), "{}", pending.body);
    let complete = http
        .get("/dashboard/trainjobs?state=Complete", &alice)
        .await;
    assert!(complete.body.contains("0 TrainJobs"), "{}", complete.body);
    // Bad and oversized input: a 400 naming the parameter.
    for (query, says) in [
        ("state=Sleeping", "state:"),
        ("size=100000", "size:"),
        ("page=0", "page:"),
        ("colour=red", "colour"),
    ] {
        let bad = http
            .get(&format!("/dashboard/trainjobs?{query}"), &alice)
            .await;
        assert_eq!(bad.status, 400, "{query}");
        assert!(bad.body.contains(says), "{query}: {}", bad.body);
    }
    let long = http
        .get(
            &format!("/dashboard/trainjobs?prefix={}", "a".repeat(3000)),
            &alice,
        )
        .await;
    assert_eq!(long.status, 400);

    // Escaping: a filter value echoed, a hostile annotation shown.
    let page = http
        .get(
            "/dashboard/trainjobs?prefix=%3Cscript%3Ex%3C%2Fscript%3E",
            &alice,
        )
        .await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("<script>x"), "{}", page.body);
    assert!(
        page.body.contains("&lt;script&gt;x&lt;/script&gt;"),
        "{}",
        page.body
    );
    let detail = http
        .get("/dashboard/trainjobs/team-a/hostile", &alice)
        .await;
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert!(!detail.body.contains("<script>alert"), "{}", detail.body);
    assert!(
        detail
            .body
            .contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        detail.body
    );
    // A trace id that is no hex is shown, not linked; a W3C one is linked
    // through --dashboard-trace-url.
    assert!(
        !detail.body.contains("id=\"trace-link\""),
        "{}",
        detail.body
    );
    let traced = http.get("/dashboard/trainjobs/team-a/traced", &alice).await;
    assert!(
        traced.body.contains(
            "id=\"trace-link\" href=\"https://jaeger.example/trace/4bf92f3577b34da6a3ce929d0e0e4736\""
        ),
        "{}",
        traced.body
    );

    // Actions need the session's CSRF token and this origin.
    let detail = http.get("/dashboard/trainjobs/team-a/a-0", &alice).await;
    let csrf = csrf_of(&detail.body);
    let suspended = || {
        hub.kubectl_ok(&[
            "get",
            "trainjob",
            "a-0",
            "-n",
            "team-a",
            "-o",
            "jsonpath={.spec.suspend}",
        ])
    };
    let origin = format!("https://127.0.0.1:{}", hub.port);
    let admins_csrf = csrf_of(&http.get("/dashboard/", &admin).await.body);
    let forged = [
        ("no token", origin.as_str(), String::new()),
        ("a wrong token", origin.as_str(), "csrf=00".to_string()),
        (
            "another origin",
            "https://evil.example",
            format!("csrf={csrf}"),
        ),
        (
            "the admin's token",
            origin.as_str(),
            format!("csrf={admins_csrf}"),
        ),
    ];
    for (what, from, body) in &forged {
        let answer = http
            .post_form(
                "/dashboard/trainjobs/team-a/a-0/suspend",
                &[("cookie", &alice), ("origin", from)],
                body,
            )
            .await;
        assert_eq!(answer.status, 403, "{what}: {}", answer.body);
    }
    assert_ne!(suspended(), "true", "a forged action changed nothing");
    let answer = http
        .post_form(
            "/dashboard/trainjobs/team-a/a-0/suspend",
            &[("cookie", &alice), ("origin", &origin)],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(answer.status, 303, "{}", answer.body);
    assert_eq!(answer.header("location"), "/dashboard/trainjobs/team-a/a-0");
    assert_eq!(suspended(), "true");
    let page = http.get("/dashboard/trainjobs/team-a/a-0", &alice).await;
    assert!(page.body.contains("id=\"resume\""), "{}", page.body);
    // alice's valid token does not reach team-b: the API's 403.
    let answer = http
        .post_form(
            "/dashboard/trainjobs/team-b/secret-b/delete",
            &[("cookie", &alice), ("origin", &origin)],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(answer.status, 403, "{}", answer.body);
    hub.kubectl_ok(&["get", "trainjob", "secret-b", "-n", "team-b"]);
    // Nor may she cordon a spoke.
    let answer = http
        .post_form(
            "/dashboard/spokes/spoke-1/cordon",
            &[("cookie", &alice), ("origin", &origin)],
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(answer.status, 403, "{}", answer.body);

    // The live table: alice gets a row event for a new TrainJob of
    // team-a, none for team-b's.
    let cookie = [("cookie", alice.as_str())];
    let live = || http.send("GET", "/dashboard/trainjobs/live", &cookie, "");
    let response = live().await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut body = response.into_body();
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&format!(
            "{}---\n{}",
            trainjob_yaml("team-b", "live-b", &[], "print(1)"),
            trainjob_yaml("team-a", "live-a", &[], "print(1)")
        )),
    );
    let mut seen = String::new();
    let text = tokio::time::timeout(Duration::from_secs(60), async {
        while !seen.contains("tj/team-a/live-a") {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        seen.push_str(&String::from_utf8_lossy(data));
                    }
                }
                _ => break,
            }
        }
        seen
    })
    .await
    .expect("a row event for live-a within 60 s");
    assert!(text.contains("event: row"), "{text}");
    assert!(text.contains("\"state\":\"Pending\""), "{text}");
    assert!(!text.contains("live-b"), "{text}");

    // While it runs, it holds alice's one stream: a second is refused as
    // the API refuses a watch over the cap; once closed, she may open one.
    let second = live().await;
    assert_eq!(second.status(), 429, "a second stream was let through");
    assert_eq!(second.headers()["retry-after"], "1");
    let page = second.into_body().collect().await.unwrap().to_bytes();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains("watches and log streams open, the limit per user"),
        "{page}"
    );
    drop(body);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let again = live().await;
        if again.status() == 200 {
            break;
        }
        assert_eq!(again.status(), 429);
        assert!(
            std::time::Instant::now() < deadline,
            "the closed stream's place was not given back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The overview counts alice's TrainJobs only, and shows her
    // namespace's quota, not another's.
    for ns in ["team-a", "team-b"] {
        hub.kubectl_ok(&[
            "create",
            "quota",
            &format!("{ns}-objects"),
            "--hard=count/trainjobs.trainer.kubeflow.org=100",
            "-n",
            ns,
        ]);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let overview = http.get("/dashboard/", &alice).await;
        assert_eq!(overview.status, 200);
        assert!(!overview.body.contains("secret-b"), "{}", overview.body);
        assert!(
            !overview.body.contains("team-b-objects"),
            "{}",
            overview.body
        );
        if overview.body.contains("<strong>8</strong> in all")
            && overview.body.contains("<td>team-a-objects</td><td>count/trainjobs.trainer.kubeflow.org</td><td>8 / 100</td>")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the overview never counted alice's 8 TrainJobs against her quota: {}",
            overview.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A queued TrainJob: its ClusterQueue's usage on the overview, its
    // Workload's conditions on its page.
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata:\n  name: default-flavor\n---\n\
             apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata:\n  name: team-queue\nspec:\n  namespaceSelector: {}\n  cohortName: research\n  resourceGroups:\n  - coveredResources: [cpu, memory]\n    flavors:\n    - name: default-flavor\n      resources:\n      - name: cpu\n        nominalQuota: 4\n      - name: memory\n        nominalQuota: 64Gi\n---\n\
             apiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata:\n  namespace: team-a\n  name: user-queue\nspec:\n  clusterQueue: team-queue\n",
        ),
    );
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob_yaml(
            "team-a",
            "queued",
            &[("kueue.x-k8s.io/queue-name", "user-queue")],
            "print(1)",
        )),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let overview = http.get("/dashboard/", &admin).await;
        let detail = http.get("/dashboard/trainjobs/team-a/queued", &alice).await;
        let queue_shown = overview.body.contains("team-queue")
            && overview.body.contains("research")
            && overview.body.contains(" / 4</td>");
        let workload_shown = detail.body.contains("Queue: Workload trainjob-queued-")
            && detail.body.contains("QuotaReserved");
        if queue_shown && workload_shown {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the queue on the overview ({queue_shown}) and the Workload on the page ({workload_shown}):\n{}\n{}",
            overview.body,
            detail.body
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let queued = http
        .get("/dashboard/trainjobs?queue=user-queue", &alice)
        .await;
    assert!(queued.body.contains("1 TrainJob "), "{}", queued.body);

    // The plugins and runtimes page: the built-ins, their digests, the
    // runtimes and the plugin of their framework.
    let plugins = http.get("/dashboard/plugins", &admin).await;
    assert_eq!(plugins.status, 200);
    assert!(plugins.body.contains("builtin-torch"), "{}", plugins.body);
    assert!(
        plugins.body.contains("torch-distributed"),
        "{}",
        plugins.body
    );
    let digest = hub.kubectl_ok(&[
        "get",
        "trainerplugin",
        "builtin-torch",
        "-o",
        "jsonpath={.status.digest}",
    ]);
    assert!(
        !digest.is_empty() && plugins.body.contains(&digest),
        "{digest}: {}",
        plugins.body
    );
}
