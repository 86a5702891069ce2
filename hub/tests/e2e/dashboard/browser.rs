//! The dashboard in a real headless Chromium, driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`): log in, see both spokes of
//! `trainhub dev` and cordon one, watch a TrainJob submitted with kubectl go to Complete
//! without reloading, filter the table, open the detail, follow a log,
//! suspend and resume, delete with confirmation, and be refused another
//! namespace as a tenant. It takes the screenshot the README shows
//! (written to docs/dashboard.png with `TRAINHUB_UPDATE_SCREENSHOT=1`).
//!
//! Skipped, saying so, when `chromedriver` is not installed, unless
//! `TRAINHUB_REQUIRE_BROWSER` is set (CI sets it).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::{ADMIN, ALICE, tenants, trainjob_yaml};
use crate::common::{DevHub, free_port, tail};

/// The WebDriver server, or None (the test is skipped) when absent.
fn chromedriver() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromedriver"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("TRAINHUB_REQUIRE_BROWSER").is_none(),
            "TRAINHUB_REQUIRE_BROWSER is set but chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
        println!(
            "skipped: chromedriver is not installed (apt-get install chromium chromium-driver)"
        );
    }
    found
}

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start(binary: &Path) -> Driver {
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, port }
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"args": [
                "--headless=new", "--no-sandbox", "--ignore-certificate-errors",
                "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1440,1000",
            ]}),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session")
    }
}

/// Polls `check` until it gives a value; past `timeout`, fails saying
/// `what` with the hub's log and the page's source.
async fn until<T, F, Fut>(
    what: &str,
    hub: &DevHub,
    client: &Client,
    timeout: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            let source = client.source().await.unwrap_or_default();
            panic!(
                "timed out waiting for {what}\npage:\n{source}\nhub log:\n{}",
                tail(&hub.log(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Clicks the element `css`, which must be there.
async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
}

/// The text of the element `css`, if it is there.
async fn text(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// Logs in through the form; the user's name once the overview shows it.
async fn log_in(hub: &DevHub, client: &Client, base: &str, token: &str) -> String {
    client.goto(&format!("{base}/dashboard/")).await.unwrap();
    let field = until(
        "the login form",
        hub,
        client,
        Duration::from_secs(30),
        || async { client.find(Locator::Css("#token")).await.ok() },
    )
    .await;
    field.send_keys(token).await.unwrap();
    click(client, "section.login button[type=submit]").await;
    until(
        "the logged-in overview",
        hub,
        client,
        Duration::from_secs(30),
        || async { text(client, "#user").await },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_watches_filters_follows_suspends_and_is_refused() {
    let Some(binary) = chromedriver() else { return };
    let hub = tenants(&["--spokes", "2"]);
    let driver = Driver::start(&binary);
    let client = driver.browser().await;
    let base = format!("https://127.0.0.1:{}", hub.port);
    let long = Duration::from_secs(120);

    // Log in as the admin; the overview shows both local spokes connected.
    assert_eq!(log_in(&hub, &client, &base, ADMIN).await, "admin");
    until(
        "both spokes Connected on the overview",
        &hub,
        &client,
        long,
        || async {
            client.goto(&format!("{base}/dashboard/")).await.ok()?;
            let rows = client
                .find_all(Locator::Css("tr.spoke[data-state=Connected]"))
                .await
                .ok()?;
            (rows.len() == 2).then_some(())
        },
    )
    .await;
    assert!(
        text(&client, "#spoke-spoke-1")
            .await
            .unwrap()
            .contains("cpu=4")
    );

    // The admin cordons a spoke and uncordons it, as `trainctl spoke cordon`.
    let unschedulable = || {
        hub.kubectl_ok(&[
            "get",
            "spoke",
            "spoke-2",
            "-o",
            "jsonpath={.spec.unschedulable}",
        ])
    };
    click(&client, "#spoke-spoke-2 form button").await;
    until("spoke-2 cordoned", &hub, &client, long, || async {
        let button = text(&client, "#spoke-spoke-2 form button").await?;
        (button == "Uncordon" && unschedulable() == "true").then_some(())
    })
    .await;
    click(&client, "#spoke-spoke-2 form button").await;
    until("spoke-2 uncordoned", &hub, &client, long, || async {
        let button = text(&client, "#spoke-spoke-2 form button").await?;
        (button == "Cordon" && unschedulable() == "false").then_some(())
    })
    .await;

    // A TrainJob submitted with kubectl appears on the open table and goes
    // to Complete, live: the page is never reloaded.
    client
        .goto(&format!("{base}/dashboard/trainjobs"))
        .await
        .unwrap();
    client
        .execute("document.body.dataset.marker = 'not reloaded'", vec![])
        .await
        .unwrap();
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob_yaml(
            "default",
            "browser-quick",
            &[],
            "print('hello from the browser test')",
        )),
    );
    let row = "tr[id='tj/default/browser-quick']";
    until(
        "browser-quick Complete without a reload",
        &hub,
        &client,
        long,
        || async {
            let state = client
                .find(Locator::Css(row))
                .await
                .ok()?
                .attr("data-state")
                .await
                .ok()??;
            (state == "Complete").then_some(())
        },
    )
    .await;
    let marker = client
        .execute("return document.body.dataset.marker", vec![])
        .await
        .unwrap();
    assert_eq!(marker, json!("not reloaded"));
    let spoke = text(&client, &format!("{row} td[data-col=spoke]"))
        .await
        .unwrap();
    assert!(spoke.starts_with("spoke-"), "{spoke}");

    // A long-running job to follow, suspend and resume.
    let script = "import time\nfor i in range(600):\n    print(f'step {i}', flush=True)\n    time.sleep(0.25)\n";
    hub.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&trainjob_yaml(
            "default",
            "browser-follow",
            &[("team", "ml")],
            script,
        )),
    );

    // Filters: name prefix and state, on the server.
    client
        .goto(&format!("{base}/dashboard/trainjobs"))
        .await
        .unwrap();
    let prefix = client
        .find(Locator::Css("#filters input[name=prefix]"))
        .await
        .unwrap();
    prefix.send_keys("browser-q").await.unwrap();
    client
        .find(Locator::Css("#filters select[name=state]"))
        .await
        .unwrap()
        .select_by_value("Complete")
        .await
        .unwrap();
    click(&client, "#filters button[type=submit]").await;
    until("the filtered table", &hub, &client, long, || async {
        let url = client.current_url().await.ok()?;
        (url.query()?.contains("prefix=browser-q")).then_some(())
    })
    .await;
    let rows = client.find_all(Locator::Css("#jobs tr")).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(
        text(&client, "#count")
            .await
            .unwrap()
            .starts_with("1 TrainJob ")
    );

    // The detail of the finished job: its log.
    client
        .find(Locator::Css(&format!("{row} td[data-col=name] a")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("the detail page", &hub, &client, long, || async {
        (text(&client, "#job-state").await? == "Complete").then_some(())
    })
    .await;
    until("the finished pod's log", &hub, &client, long, || async {
        text(&client, "pre.log")
            .await?
            .contains("hello from the browser test")
            .then_some(())
    })
    .await;

    // Follow the running job's log: new lines arrive.
    let detail = format!("{base}/dashboard/trainjobs/default/browser-follow");
    until(
        "browser-follow running with a pod",
        &hub,
        &client,
        long,
        || async {
            client.goto(&detail).await.ok()?;
            let state = text(&client, "#job-state").await?;
            let follow = client.find(Locator::Css("button.follow")).await.ok()?;
            (state == "Running").then_some(follow)
        },
    )
    .await
    .click()
    .await
    .unwrap();
    let first = until("a followed line", &hub, &client, long, || async {
        let log = text(&client, "pre.log").await?;
        let last = log.lines().rev().find_map(|l| l.strip_prefix("step "))?;
        last.parse::<u32>().ok()
    })
    .await;
    until(
        "later lines while following",
        &hub,
        &client,
        long,
        || async {
            let log = text(&client, "pre.log").await?;
            let last: u32 = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("step "))?
                .parse()
                .ok()?;
            (last >= first + 8).then_some(())
        },
    )
    .await;

    // Suspend, then resume.
    let suspend_of =
        |name: &str| hub.kubectl_ok(&["get", "trainjob", name, "-o", "jsonpath={.spec.suspend}"]);
    click(&client, "#suspend").await;
    until("Suspended", &hub, &client, long, || async {
        (text(&client, "#job-state").await? == "Suspended").then_some(())
    })
    .await;
    assert_eq!(suspend_of("browser-follow"), "true");
    click(&client, "#resume").await;
    until("resumed", &hub, &client, long, || async {
        let state = text(&client, "#job-state").await?;
        (state != "Suspended").then_some(())
    })
    .await;
    assert_eq!(suspend_of("browser-follow"), "false");

    // The screenshot of the README: the table with both jobs.
    client
        .goto(&format!("{base}/dashboard/trainjobs"))
        .await
        .unwrap();
    until("both rows", &hub, &client, long, || async {
        let rows = client.find_all(Locator::Css("#jobs tr")).await.ok()?;
        (rows.len() == 2).then_some(())
    })
    .await;
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    // docs/dashboard.png is replaced only when asked: a test run leaves the
    // work tree as it was.
    let shot = if std::env::var_os("TRAINHUB_UPDATE_SCREENSHOT").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png")
    };
    std::fs::write(&shot, &png).expect("writing the screenshot");
    println!("screenshot: {}", shot.display());

    // Delete, after confirming.
    client.goto(&detail).await.unwrap();
    click(&client, "#delete").await;
    click(&client, "#confirm-delete").await;
    until("browser-follow deleted", &hub, &client, long, || async {
        let out = hub.kubectl(&["get", "trainjob", "browser-follow"]);
        (!out.status.success()).then_some(())
    })
    .await;

    // A tenant: log out, log in as alice, refused the default namespace.
    click(&client, "form.logout button").await;
    // The click returns before the logout's answer (which clears the
    // cookie) has come: going elsewhere now would race it.
    until(
        "the login form after logging out",
        &hub,
        &client,
        long,
        || async { client.find(Locator::Css("#token")).await.ok().map(|_| ()) },
    )
    .await;
    assert_eq!(log_in(&hub, &client, &base, ALICE).await, "alice");
    client
        .goto(&format!("{base}/dashboard/trainjobs?namespace=default"))
        .await
        .unwrap();
    let refusal = text(&client, "section.error")
        .await
        .expect("a refusal page");
    assert!(refusal.contains("403"), "{refusal}");
    assert!(refusal.contains("User \"alice\" cannot list"), "{refusal}");
    let source = client.source().await.unwrap();
    assert!(!source.contains("browser-quick"), "{source}");
    client
        .goto(&format!("{base}/dashboard/trainjobs"))
        .await
        .unwrap();
    let source = client.source().await.unwrap();
    assert!(
        !source.contains("browser-quick"),
        "a tenant's table: {source}"
    );

    client.close().await.unwrap();
    drop(driver);
}
