// The trainhub dashboard's script: applies the live TrainJobs table's
// server-sent events to its rows, and streams pod logs. Text only: the
// server's values are set as text, never parsed as HTML.
"use strict";

// Lines a log view keeps (older ones are dropped).
const MAX_LOG_LINES = 5000;

function liveTable() {
  const body = document.getElementById("jobs");
  if (!body || !body.dataset.live || !window.EventSource) return;
  const columns = Array.from(document.querySelectorAll("table.jobs thead th"))
    .map((th) => th.dataset.col);
  const source = new EventSource(body.dataset.live);
  source.addEventListener("row", (event) => {
    let row;
    let update;
    try { update = JSON.parse(event.data); } catch (_) { return; }
    row = document.getElementById(update.id);
    if (update.gone) { if (row) row.remove(); return; }
    if (!row) {
      if (body.dataset.insert !== "top") return;
      row = document.createElement("tr");
      row.id = update.id;
      for (const column of columns) {
        const cell = document.createElement("td");
        cell.dataset.col = column;
        row.appendChild(cell);
      }
      body.prepend(row);
    }
    row.dataset.state = update.state;
    for (const cell of row.children) {
      const text = update.cells[cell.dataset.col] || "";
      if (cell.dataset.col === "name") {
        const link = document.createElement("a");
        link.href = update.href;
        link.textContent = text;
        cell.replaceChildren(link);
      } else if (cell.textContent !== text) {
        cell.textContent = text;
      }
    }
  });
  source.addEventListener("reload", () => { source.close(); window.location.reload(); });
}

function streamLog(pre, url, done) {
  if (pre.source) pre.source.close();
  const source = new EventSource(url);
  pre.source = source;
  const finish = () => { source.close(); if (done) done(); };
  const append = (text) => {
    const follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(text + "\n");
    while (pre.childNodes.length > MAX_LOG_LINES) pre.firstChild.remove();
    if (follow) pre.scrollTop = pre.scrollHeight;
  };
  source.addEventListener("line", (event) => append(event.data));
  source.addEventListener("problem", (event) => append("[" + event.data + "]"));
  source.addEventListener("end", finish);
  source.onerror = finish;
}

function logs() {
  for (const pre of document.querySelectorAll("pre.log[data-src]")) {
    streamLog(pre, pre.dataset.src);
  }
  for (const button of document.querySelectorAll("button.follow[data-log]")) {
    button.addEventListener("click", () => {
      const pre = button.parentElement.querySelector("pre.log");
      pre.textContent = "";
      button.disabled = true;
      button.textContent = "Following…";
      pre.dataset.following = "true";
      streamLog(pre, button.dataset.log + "?follow=1", () => {
        button.disabled = false;
        button.textContent = "Follow";
        delete pre.dataset.following;
      });
    });
  }
}

document.addEventListener("DOMContentLoaded", () => { liveTable(); logs(); });
