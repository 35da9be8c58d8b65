// Both ends of reading a fire's answer (pg/calls.hpp) and of the one JSON policy
// (base/json_get.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "base/json_get.hpp"
#include "pg/calls.hpp"

using namespace qsw;
using nlohmann::json;

TEST(JsonGet, AbsentNullOrOtherTypeReadsAsTheDefault) {
    const json j = json::parse(R"({"n": 5, "s": "x", "b": true, "z": null, "f": 1.5, "neg": -3})");
    EXPECT_EQ(json_get<int64_t>(j, "n", -1), 5);
    EXPECT_EQ(json_get<int64_t>(j, "neg", 0), -3);
    EXPECT_EQ(json_get<int64_t>(j, "missing", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "z", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "s", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "b", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "f", -1), -1);  // a float is not an integer
    EXPECT_EQ(json_get(j, "s", ""), "x");
    EXPECT_EQ(json_get(j, "n", "d"), "d");
    EXPECT_TRUE(json_get(j, "b", false));
    EXPECT_FALSE(json_get(j, "n", false));
    EXPECT_DOUBLE_EQ(json_get(j, "f", 0.0), 1.5);
    EXPECT_DOUBLE_EQ(json_get(j, "n", 0.0), 5.0);
    EXPECT_EQ(json_get<int64_t>(json::array({1, 2}), "n", 7), 7);  // not an object
    EXPECT_EQ(json_get<int64_t>(json(), "n", 7), 7);
}

TEST(JsonGet, IntegersAtTheEdgesOfInt64) {
    const json j = json::parse(R"({"max": 9223372036854775807, "over": 9223372036854775808,
                                   "min": -9223372036854775808, "huge": 18446744073709551615,
                                   "beyond": 1e30})");
    EXPECT_EQ(json_get<int64_t>(j, "max", 0), std::numeric_limits<int64_t>::max());
    EXPECT_EQ(json_get<int64_t>(j, "over", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "min", 0), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(json_get<int64_t>(j, "huge", -1), -1);
    EXPECT_EQ(json_get<int64_t>(j, "beyond", -1), -1);
}

TEST(FireAnswer, NotJsonOrNoSegmentsArrayIsUnreadable) {
    for (const char *text : {"", "not json", "{", "[]", "null", "42", "\"segments\"", "{}", R"({"segments": null})",
                             R"({"segments": {}})", R"({"segments": "fired"})", R"({"Segments": []})"}) {
        const FireAnswer a = parse_fire_answer(std::string_view(text));
        EXPECT_FALSE(a.readable) << text;
        EXPECT_FALSE(a.unreadable.empty()) << text;
        EXPECT_TRUE(a.segments.empty()) << text;
    }
}

TEST(FireAnswer, ASegmentThatIsNotAnObjectOrAStatusOfAnotherTypeIsUnreadable) {
    for (const char *text : {R"({"segments": [1]})", R"({"segments": [{"status": "fired"}, "busy"]})",
                             R"({"segments": [null]})", R"({"segments": [{"status": 1}]})",
                             R"({"segments": [{"status": ["fired"]}]})"}) {
        const FireAnswer a = parse_fire_answer(std::string_view(text));
        EXPECT_FALSE(a.readable) << text;
        EXPECT_TRUE(a.segments.empty()) << text;
    }
}

TEST(FireAnswer, TheCompactFormReadsAsTheFullOne) {
    const FireAnswer a = parse_fire_answer(std::string_view(
        R"({"statuses": "fbsdff", "baseOffsets": [1041, 7, 9223372036854775807], "staleHeld": [2],
            "dupDuplicates": [4], "dupReleased": [1], "fired": 5, "provisionBusy": 1})"));
    ASSERT_TRUE(a.readable) << a.unreadable;
    ASSERT_EQ(a.segments.size(), 6u);
    EXPECT_EQ(a.segments[0].status, FireSegStatus::fired);
    EXPECT_EQ(a.segments[0].base_offset, 1041);
    EXPECT_EQ(a.segments[1].status, FireSegStatus::busy);
    EXPECT_EQ(a.segments[1].base_offset, -1);
    EXPECT_EQ(a.segments[2].status, FireSegStatus::stale);
    EXPECT_EQ(a.segments[2].held, 2);
    EXPECT_EQ(a.segments[3].status, FireSegStatus::duplicate);
    EXPECT_EQ(a.segments[3].duplicates, 4);
    EXPECT_EQ(a.segments[3].released, 1);
    EXPECT_EQ(a.segments[4].base_offset, 7);
    EXPECT_EQ(a.segments[5].base_offset, std::numeric_limits<int64_t>::max());
    EXPECT_EQ(a.provision_busy, 1);
    EXPECT_EQ(a.segment(6).status, FireSegStatus::busy);  // past the answer: busy, as in the full form

    const FireAnswer e = parse_fire_answer(std::string_view(
        R"({"statuses": "", "baseOffsets": [], "staleHeld": [], "dupDuplicates": [], "dupReleased": []})"));
    ASSERT_TRUE(e.readable) << e.unreadable;
    EXPECT_TRUE(e.segments.empty());
}

TEST(FireAnswer, ACompactFormThatDoesNotAddUpIsUnreadable) {
    const char *arrays = R"("staleHeld": [], "dupDuplicates": [], "dupReleased": [])";
    for (const std::string &text : {
             std::string(R"({"statuses": 1, "baseOffsets": [], )") + arrays + "}",
             std::string(R"({"statuses": null, "baseOffsets": [], )") + arrays + "}",
             std::string(R"({"statuses": "f", )") + arrays + "}",                        // no baseOffsets
             std::string(R"({"statuses": "f", "baseOffsets": {}, )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": [], )") + arrays + "}",     // shorter
             std::string(R"({"statuses": "f", "baseOffsets": [1, 2], )") + arrays + "}", // longer
             std::string(R"({"statuses": "", "baseOffsets": [1], )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": ["1"], )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": [1.5], )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": [null], )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": [-1], )") + arrays + "}",
             std::string(R"({"statuses": "f", "baseOffsets": [9223372036854775808], )") + arrays + "}",
             std::string(R"({"statuses": "x", "baseOffsets": [], )") + arrays + "}",
             std::string(R"({"statuses": "F", "baseOffsets": [1], )") + arrays + "}",
             std::string(R"({"statuses": "d", "baseOffsets": [], "staleHeld": [], "dupDuplicates": [1], "dupReleased": []})"),
             std::string(R"({"statuses": "s", "baseOffsets": [], "staleHeld": [], "dupDuplicates": [], "dupReleased": []})"),
         }) {
        const FireAnswer a = parse_fire_answer(std::string_view(text));
        EXPECT_FALSE(a.readable) << text;
        EXPECT_FALSE(a.unreadable.empty()) << text;
        EXPECT_TRUE(a.segments.empty()) << text;
    }
}

TEST(FireAnswer, AnEmptyArrayIsReadableAndEverySegmentOfTheCallIsBusy) {
    const FireAnswer a = parse_fire_answer(std::string_view(R"({"segments": []})"));
    ASSERT_TRUE(a.readable);
    EXPECT_TRUE(a.segments.empty());
    EXPECT_EQ(a.provision_busy, 0);
    EXPECT_EQ(a.segment(0).status, FireSegStatus::busy);
    EXPECT_EQ(a.segment(7).status, FireSegStatus::busy);
    EXPECT_EQ(a.segment(7).base_offset, -1);
}

TEST(FireAnswer, MissingKeysAndWrongTypesReadAsTheirDefaults) {
    const FireAnswer a = parse_fire_answer(std::string_view(
        R"({"segments": [{}, {"status": null}, {"status": ""}, {"status": "fired"},
                         {"status": "fired", "baseOffset": "12"}, {"status": "stale", "held": 2.5},
                         {"status": "duplicate", "duplicates": true, "released": null}, {"status": "weird"}],
            "provisionBusy": "3"})"));
    ASSERT_TRUE(a.readable);
    ASSERT_EQ(a.segments.size(), 8u);
    EXPECT_EQ(a.segments[0].status, FireSegStatus::busy);
    EXPECT_EQ(a.segments[1].status, FireSegStatus::busy);
    EXPECT_EQ(a.segments[2].status, FireSegStatus::busy);
    EXPECT_EQ(a.segments[3].status, FireSegStatus::fired);
    EXPECT_EQ(a.segments[3].base_offset, -1);
    EXPECT_EQ(a.segments[4].base_offset, -1);
    EXPECT_EQ(a.segments[5].status, FireSegStatus::stale);
    EXPECT_EQ(a.segments[5].held, 0);
    EXPECT_EQ(a.segments[6].status, FireSegStatus::duplicate);
    EXPECT_EQ(a.segments[6].duplicates, 0);
    EXPECT_EQ(a.segments[6].released, 0);
    EXPECT_EQ(a.segments[7].status, FireSegStatus::other);
    EXPECT_EQ(a.provision_busy, 0);
}

TEST(FireAnswer, HugeAndNegativeNumbers) {
    const FireAnswer a = parse_fire_answer(std::string_view(
        R"({"segments": [{"status": "fired", "baseOffset": 9223372036854775807},
                         {"status": "fired", "baseOffset": 9223372036854775808},
                         {"status": "stale", "held": 18446744073709551615}],
            "provisionBusy": -4})"));
    ASSERT_TRUE(a.readable);
    EXPECT_EQ(a.segments[0].base_offset, std::numeric_limits<int64_t>::max());
    EXPECT_EQ(a.segments[1].base_offset, -1);
    EXPECT_EQ(a.segments[2].held, 0);
    EXPECT_EQ(a.provision_busy, 0);  // never below zero
}

TEST(FireAnswer, AFullRealisticAnswer) {
    const FireAnswer a = parse_fire_answer(std::string_view(R"({
        "segments": [
            {"status": "fired", "baseOffset": 1041, "count": 3, "partition": "p0"},
            {"status": "busy", "reason": "partition"},
            {"status": "stale", "held": 2, "missing": 1},
            {"status": "duplicate", "duplicates": 4, "released": 4}
        ],
        "provisionBusy": 1, "fired": 3, "elapsedMs": 2})"));
    ASSERT_TRUE(a.readable);
    EXPECT_TRUE(a.unreadable.empty());
    ASSERT_EQ(a.segments.size(), 4u);
    EXPECT_EQ(a.segments[0].status, FireSegStatus::fired);
    EXPECT_EQ(a.segments[0].base_offset, 1041);
    EXPECT_EQ(a.segments[1].status, FireSegStatus::busy);
    EXPECT_EQ(a.segments[2].status, FireSegStatus::stale);
    EXPECT_EQ(a.segments[2].held, 2);
    EXPECT_EQ(a.segments[3].status, FireSegStatus::duplicate);
    EXPECT_EQ(a.segments[3].duplicates, 4);
    EXPECT_EQ(a.segments[3].released, 4);
    EXPECT_EQ(a.provision_busy, 1);
    EXPECT_EQ(a.segment(4).status, FireSegStatus::busy);  // the call had more segments than answered
    // The same answer as a parsed value reads the same.
    const FireAnswer b = read_fire_answer(json::parse(R"({"segments": [{"status": "fired", "baseOffset": 7}]})"));
    ASSERT_TRUE(b.readable);
    EXPECT_EQ(b.segments[0].base_offset, 7);
}

TEST(FireAnswer, PartitionAddressesAreReadPerSegmentOrNotAtAll) {
    // Compact and full forms alike: one element per segment, null or a tid.
    FireAnswer a = parse_fire_answer(
        R"j({"statuses": "fbf", "baseOffsets": [0, 7], "staleHeld": [], "dupDuplicates": [], "dupReleased": [],
            "partitionTids": ["(0,1)", null, "(4294967295,65535)"]})j");
    ASSERT_TRUE(a.readable) << a.unreadable;
    ASSERT_EQ(a.partition_tids.size(), 3u);
    EXPECT_EQ(a.partition_tids[0], "(0,1)");
    EXPECT_EQ(a.partition_tids[1], "");
    EXPECT_EQ(a.partition_tids[2], "(4294967295,65535)");
    a = parse_fire_answer(R"j({"segments": [{"status": "fired", "baseOffset": 3}], "partitionTids": ["(12,3)"]})j");
    ASSERT_TRUE(a.readable);
    ASSERT_EQ(a.partition_tids.size(), 1u);
    EXPECT_EQ(a.partition_tids[0], "(12,3)");
    // A hint only: anything off drops every address, and the answer stays readable.
    for (const char *tids : {R"j("partitionTids": null)j", R"j("partitionTids": "(0,1)")j",
                             R"j("partitionTids": ["(0,1)"])j",                    // shorter than the segments
                             R"j("partitionTids": ["(0,1)", "(0,2)", "(0,3)"])j",  // longer
                             R"j("partitionTids": ["(0,1)", 5])j",                 // not a string
                             R"j("partitionTids": ["(0,1)", "(0,0)"])j",           // offset 0 is no tid
                             R"j("partitionTids": ["(0,1)", "(4294967296,1)"])j",  // block past 32 bits
                             R"j("partitionTids": ["(0,1)", "(0,1)\"}"])j",        // quoting, injected
                             R"j("partitionTids": ["(0,1)", " (0,1)"])j", R"j("x": 1)j"}) {
        a = parse_fire_answer(
            std::string(R"j({"segments": [{"status": "fired", "baseOffset": 1}, {"status": "busy"}], )j") + tids + "}");
        ASSERT_TRUE(a.readable) << tids << ": " << a.unreadable;
        EXPECT_EQ(a.segments.size(), 2u) << tids;
        EXPECT_TRUE(a.partition_tids.empty()) << tids;
    }
}
