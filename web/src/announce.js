// What a screen reader hears of a streamed answer: whole sentences as they complete, not every token (a polite
// live region re-read per token would never finish a sentence).

const BOUNDARY = /[.!?…:;](?=\s)|\n/g;
const LONGEST = 240; // a run-on without punctuation is still read, at a word boundary

export class Announcer {
  constructor() {
    this.heard = 0; // characters of the answer already handed out
  }

  /** The part of `text` (the whole answer so far) ready to be read out now, or "" when none is. */
  next(text) {
    if (text.length < this.heard) this.heard = text.length; // moderation withdrew part of the answer
    const pending = text.slice(this.heard);
    let end = 0;
    for (const match of pending.matchAll(BOUNDARY)) end = match.index + match[0].length;
    if (!end && pending.length > LONGEST) end = pending.lastIndexOf(" ") + 1;
    if (!end) return "";
    this.heard += end;
    return pending.slice(0, end).trim();
  }

  /** Whatever is left once the answer has ended. */
  rest(text) {
    const left = text.slice(Math.min(this.heard, text.length)).trim();
    this.heard = text.length;
    return left;
  }
}
